"""The worker on a key-limited queue (issue 25): with every key at its limit, a claim comes back
short until our own jobs' completions commit; the worker then claims again at once, woken by its
own completer (a freed slot or a committed completion is never held back like a NOTIFY is), not at
its idle poll interval (an hour here). Both runtimes, a real database; the limit is checked on
every handler's recorded interval, and the claims are counted by pg_stat_user_functions."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgq_thin.worker import AsyncWorker, Worker

from sqlhelpers import claims, one, run_worker, wait_for


def test_a_worker_drains_a_key_limited_queue_without_waiting_for_its_poll(dsn: str, conn: psycopg.Connection,
                                                                         runtime: str) -> None:
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'pl'")
    conn.execute("SELECT pgq.configure_queue('q', key_max_running => 1)")
    per_key = 25
    for key in ("a", "b"):
        conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill(jsonb_build_object('key', %s::text), ARRAY[%s]),"
                     " concurrency_key => %s)", (key, per_key, key))
    jobs = 2 * per_key
    name = f"keyed-{runtime}"
    lock = threading.Lock()
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    done: list[int] = []
    errors: list[BaseException] = []
    before = claims(conn, "-")

    def handler(job: Any, ctx: Any) -> None:  # a thread handler on both runtimes
        start = time.monotonic()
        time.sleep(0.002)
        with lock:
            intervals[job.payload["key"]].append((start, time.monotonic()))
        done.append(job.id)

    # 4 slots, 2 keys at most 1 running each: every claim after the first two jobs comes back
    # short while both keys run. It never polls (every hour) nor sweeps.
    settings: dict[str, Any] = {"queues": ["q"], "concurrency": 4, "poll_interval": 3600.0, "sweep_interval": 0,
                                "name": name}
    worker: Worker | AsyncWorker = Worker(**settings) if runtime == "threads" else AsyncWorker(**settings)
    worker.handler("k")(handler)

    thread = run_worker(worker, dsn, errors)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == jobs or errors,
                 f"all {jobs} jobs done without a poll", timeout=60)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not errors, errors
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == jobs
    for key, spans in intervals.items():  # the limit held: one key's handlers never overlap
        spans.sort()
        assert len(spans) == per_key, key
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"key {key}: handlers overlapped"
    # About one claim per job's end and one per committed completion, not a spin.
    assert claims(conn, name) - before <= 3 * jobs + 4
