"""A worker whose completions fall behind claims no more (back-pressure): while BACKLOG_MAX
completions wait for their pgq.complete_many, the claimer waits until a batch of them is recorded.
Without it, a worker whose completion calls fail or crawl (a locked or overloaded database) while
its claims still go through takes the whole backlog into its hands: every job a lease to keep, and
all of them run again if the worker dies. Both runtimes, a real database: the completions are held
by a transaction that locks pgq.finished_deltas, which every completion writes and no claim does."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest

from pgq_thin.worker import AsyncWorker, Worker
from pgq_thin.worker.completer import AsyncCompleter
from pgq_thin.worker.threads.completer import Completer

from sqlhelpers import one, run_worker, wait_for

#: A small limit for the test (the default is BACKLOG_MAX).
LIMIT = 20
JOBS = 400
CONCURRENCY = 4
PREFETCH = 4


#: The worker's completion calls that wait for the lock on pgq.finished_deltas: each waits out its
#: lock_timeout (5 s; then the completer sends the batch one job at a time, and repeats it after a
#: backoff).
LOCK_WAITS = """
SELECT a.pid, a.query_start FROM pg_stat_activity AS a JOIN pg_locks AS l ON l.pid = a.pid
WHERE NOT l.granted AND l.relation = 'pgq.finished_deltas'::regclass AND a.query LIKE '%complete_many%'
"""


def logged(logs: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in list(logs.records))


def test_a_worker_whose_completions_fall_behind_claims_no_more_until_they_are_recorded(
        dsn: str, conn: psycopg.Connection, runtime: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG, logger="pgq_thin.worker")
    monkeypatch.setattr(AsyncCompleter, "backlog_max", LIMIT)
    monkeypatch.setattr(Completer, "backlog_max", LIMIT)
    conn.execute("SELECT pgq.configure_queue('q')")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))", (JOBS,))
    ran: list[int] = []
    lock = threading.Lock()

    def handler(job: Any, ctx: Any) -> None:
        with lock:
            ran.append(job.id)

    blocker = psycopg.connect(dsn)
    blocker.execute("LOCK TABLE pgq.finished_deltas IN SHARE MODE")  # every completion waits, then times out
    kind = Worker if runtime == "threads" else AsyncWorker
    worker = kind(["q"], concurrency=CONCURRENCY, prefetch=PREFETCH, poll_interval=0.1, sweep_interval=600.0,
                  shutdown_timeout=10.0, name=f"backpressure-{runtime}")
    worker.handler("k")(handler)
    errors: list[BaseException] = []
    thread = run_worker(worker, dsn, errors)
    try:
        try:
            wait_for(lambda: logged(caplog, "completions wait for pgq.complete_many") > 0, "the claimer to hold back")
            # Two completion calls that wait, one after the other (the first waited out its 5 s
            # lock_timeout): a claimer that did not hold back would have run the whole backlog by
            # then (it does in under a second). The sweep, which would wait for the lock too, is
            # not due during the test.
            waits: set[tuple[int, Any]] = set()

            def waited(calls: int) -> bool:
                waits.update(conn.execute(LOCK_WAITS).fetchall())
                return len(waits) >= calls

            wait_for(lambda: waited(2), "two completion calls to wait for the lock")
            held = one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'q' AND state = 'running'")
            with lock:
                count = len(ran)
            # The claimer stopped at LIMIT completions waiting; what its slots held then (at most
            # the concurrency and the prefetch) finished after it.
            bound = LIMIT + CONCURRENCY + PREFETCH
            assert count <= bound, (count, bound)
            assert held <= bound, (held, bound)
        finally:
            blocker.rollback()
            blocker.close()
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'q' AND state = 'done'") == JOBS,
                 "every job done once the lock is gone")
    finally:
        worker.stop()
        thread.join(30)
    assert not errors
    assert not thread.is_alive()
    assert sorted(ran) == sorted(set(ran)) and len(ran) == JOBS  # each ran once
    per_job = dict(conn.execute("SELECT job_id, count(*) FROM pgq.job_events WHERE event = 'completed'"
                                " GROUP BY job_id").fetchall())
    assert len(per_job) == JOBS and set(per_job.values()) == {1}
