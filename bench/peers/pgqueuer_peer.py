"""PgQueuer's adapter (runs in bench/peers/.work/venv): ``PgQueuer.from_asyncpg_connection`` and
``pgq.run(max_concurrent_tasks=W, batch_size=B)`` with its defaults otherwise. B is its default
batch size, 10, lowered to W // 2 where its rule ``max_concurrent_tasks >= 2 * batch_size`` demands
it (W = 4: 2; W = 16: 8). Schema: ``Queries.install()``. Jobs: one bulk ``Queries.enqueue`` of lists.

Per-key limit (keyed, variant ``entrypoints``): one entrypoint per key, each registered with
``concurrency_limit=1`` (enforced by its dequeue query, across all workers); job i is enqueued on
the entrypoint of its key.
"""

from __future__ import annotations

import asyncio
import signal

import asyncpg
import peer
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

DEFAULT_BATCH = 10


def entrypoint_of(i: int, keyed: bool) -> str:
    return peer.key_of(i) if keyed else "noop"


async def migrate(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(dsn: str, jobs: int, keyed: bool) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, jobs, 5000):
            chunk = range(start, min(jobs, start + 5000))
            await queries.enqueue([entrypoint_of(i, keyed) for i in chunk], [None] * len(chunk), [0] * len(chunk))
    finally:
        await conn.close()


async def work(dsn: str, workers: int, keyed: bool, recorder: peer.Recorder) -> None:
    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer.from_asyncpg_connection(conn)
    if keyed:
        for k in range(peer.KEYS):
            @pgq.entrypoint(peer.key_of(k), concurrency_limit=1)
            async def keyed_job(job: Job) -> None:
                start = peer.now()
                await asyncio.sleep(peer.SLEEP)
                recorder.add(job.entrypoint, start, peer.now())
    else:
        @pgq.entrypoint("noop")
        async def noop(job: Job) -> None:
            recorder.count()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, pgq.shutdown.set)  # its graceful stop
    try:
        await pgq.run(max_concurrent_tasks=workers, batch_size=max(1, min(DEFAULT_BATCH, workers // 2)))
    finally:
        if not conn.is_closed():
            await conn.close()


def main() -> None:
    args = peer.arguments()
    if args.mode == "migrate":
        asyncio.run(migrate(args.dsn))
        return
    recorder = peer.Recorder()
    asyncio.run(enqueue(args.dsn, args.jobs, args.keyed))
    peer.ready_then_go()
    asyncio.run(work(args.dsn, args.workers, args.keyed, recorder))
    recorder.report()


if __name__ == "__main__":
    main()
