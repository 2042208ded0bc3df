"""pgq's adapter: the Worker (threads) or the AsyncWorker (asyncio), each with its defaults but for
``concurrency=W``. Runs with the repository's Python, pgq_thin and pgq_tools from this checkout (run.py puts
the checkout and its tools/ on PYTHONPATH). The jobs are loaded by the benchmark's own loaders (pgq_tools.bench):
plain no-ops with pgq.enqueue_many into the queue ``bench``, keyed jobs with one pgq.enqueue per
job in one statement (keys round-robin) into ``bench_keyed``.

Variants: ``worker``, ``async-worker`` (plain); keyed: ``worker`` on a queue configured with
``pgq.configure_queue(queue, key_max_running => 1)`` and the jobs enqueued with their
``concurrency_key``, or ``worker-no-limit``: the same jobs on a queue without the limit;
``worker-keep-done-off``: the plain drain on a queue configured ``keep_done => false`` (each
completion deletes its job, as graphile-worker's does; run.py's system ``pgq-keep-done-off``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import peer

from pgq_thin import migrate
from pgq_thin.worker import AsyncWorker, Worker
from pgq_tools import bench


def load(dsn: str, jobs: int, keyed: bool, key_limit: int, variant: str) -> tuple[str, str]:
    """Queue the jobs; the queue's name and the jobs' kind."""
    with bench._connect(dsn) as conn:
        if not keyed:
            keep_done = not variant.endswith("keep-done-off")  # off: each completion deletes its job
            conn.execute("SELECT pgq.configure_queue(%s, keep_done => %s)", (bench.QUEUE, keep_done))
            bench._load_pgq(conn, jobs)
            return bench.QUEUE, "noop"
        conn.execute("SELECT pgq.configure_queue(%s, key_max_running => %s)", (bench.KEYED_QUEUE, key_limit))
        bench._keyed_load(conn, jobs, peer.KEYS, "interleaved")
        return bench.KEYED_QUEUE, "keyed"


def main() -> None:
    args = peer.arguments()
    if args.mode == "migrate":
        migrate(args.dsn)
        return
    queue, kind = load(args.dsn, args.jobs, args.keyed, 0 if args.variant.endswith("no-limit") else 1, args.variant)
    recorder = peer.Recorder()
    peer.ready_then_go()
    if args.variant == "async-worker":
        aworker = AsyncWorker(queues=[queue], concurrency=args.workers, name="peers-async")

        @aworker.handler(kind)
        async def noop(job: Any, ctx: Any) -> None:
            recorder.count()

        asyncio.run(aworker.run(args.dsn))  # SIGTERM: its graceful stop
    else:
        worker = Worker(queues=[queue], concurrency=args.workers, name="peers-worker")

        @worker.handler(kind)
        def handle(job: Any, ctx: Any) -> None:
            if args.keyed:
                start = peer.now()
                time.sleep(peer.SLEEP)
                recorder.add(job.payload["key"], start, peer.now())
            else:
                recorder.count()

        worker.run(args.dsn)  # SIGTERM: its graceful stop
    recorder.report()


if __name__ == "__main__":
    main()
