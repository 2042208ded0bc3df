"""What is AsyncWorker's own: ``async def`` handlers run as tasks of one event loop, a plain
handler runs in a thread without blocking the loop, ctx.client is an AsyncClient, a stop at once
cancels the handler tasks. (test_worker.py runs every worker behaviour against both runtimes;
the process tests run tests/apps/*_async.py too.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from pgq_thin import AsyncClient, AsyncWorker, Job, JobContext, OutcomeUnknown, Retry, Snooze

from sqlhelpers import events, job, one, wait_for
from workerkit import DEADLINE, enqueue, finished, running, state_counts


def async_worker(**settings: Any) -> AsyncWorker:
    defaults: dict[str, Any] = {"concurrency": 2, "poll_interval": 0.1, "sweep_interval": 1.0,
                                "shutdown_timeout": 10.0}
    return AsyncWorker(["default"], **{**defaults, **settings})


async def until(event: threading.Event) -> None:
    """Wait, without blocking the loop, for an Event the test sets from its own thread."""
    while not event.is_set():
        await asyncio.sleep(0.01)


def test_async_handlers_run_as_tasks_of_one_loop_concurrency_at_once(dsn: str, conn: psycopg.Connection) -> None:
    worker = async_worker(concurrency=5)
    release = threading.Event()
    inside = {"now": 0, "most": 0}
    threads: set[int] = set()

    @worker.handler("hold")
    async def hold(job: Job, ctx: JobContext) -> int:
        threads.add(threading.get_ident())
        inside["now"] += 1
        inside["most"] = max(inside["most"], inside["now"])
        await until(release)
        inside["now"] -= 1
        return job.payload["n"]

    conn.execute("SELECT pgq.enqueue_many('default', 'hold', array_agg(jsonb_build_object('n', n)))"
                 " FROM generate_series(1, 8) AS n")
    with running(worker, dsn):
        wait_for(lambda: inside["now"] == 5, "five handlers at once")
        release.set()  # (never more than concurrency: "most" below, over the whole run)
        wait_for(lambda: state_counts(conn) == {"done": 8}, "all done")
    assert inside["most"] == 5 and len(threads) == 1  # one loop's thread: tasks, not threads
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE result = payload->'n'") == 8


def test_a_plain_handler_runs_in_a_thread_and_never_blocks_the_loop(dsn: str, conn: psycopg.Connection) -> None:
    worker = async_worker(concurrency=2)
    release = threading.Event()
    loop_thread: list[int] = []

    @worker.handler("blocking")
    def blocking(job: Job, ctx: JobContext) -> int:
        release.wait(DEADLINE)  # blocks its thread, not the loop
        return threading.get_ident()

    @worker.handler("quick")
    async def quick(job: Job, ctx: JobContext) -> str:
        loop_thread.append(threading.get_ident())
        return "ran while the plain handler blocked"

    stuck = enqueue(conn, "blocking")
    with running(worker, dsn):
        wait_for(lambda: job(conn, stuck)["state"] == "running", "the blocking handler to start")
        fast = enqueue(conn, "quick")
        wait_for(finished(conn, fast), "the async handler to finish meanwhile")
        assert job(conn, stuck)["state"] == "running"
        release.set()
        wait_for(finished(conn, stuck), "the blocking handler to finish")
    assert job(conn, fast)["result"] == "ran while the plain handler blocked"
    assert job(conn, stuck)["result"] != loop_thread[0]


def test_async_handler_outcomes_map_to_the_same_owner_calls(dsn: str, conn: psycopg.Connection) -> None:
    worker = async_worker(concurrency=4)

    @worker.handler("retry")
    async def retry(job: Job, ctx: JobContext) -> None:
        raise Retry(120, reason="later")

    @worker.handler("snooze")
    async def snooze(job: Job, ctx: JobContext) -> None:
        raise Snooze(300)

    @worker.handler("unknown")
    async def unknown(job: Job, ctx: JobContext) -> None:
        raise OutcomeUnknown("sent, no answer")

    @worker.handler("boom")
    async def boom(job: Job, ctx: JobContext) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("async failure")

    ids = {kind: enqueue(conn, kind) for kind in ("retry", "snooze", "unknown", "boom")}
    with running(worker, dsn):
        wait_for(lambda: all(job(conn, i)["last_event"] in ("failed", "snoozed", "marked_unknown")
                             for i in ids.values()), "every outcome")
    assert [e[0] for e in events(conn, ids["retry"])] == ["claimed", "failed"]
    assert job(conn, ids["retry"])["last_error"] == "later"
    assert job(conn, ids["snooze"])["last_event"] == "snoozed"
    assert job(conn, ids["unknown"])["state"] == "outcome_unknown"
    assert "RuntimeError: async failure" in job(conn, ids["boom"])["last_error"]
    assert "in boom" in job(conn, ids["boom"])["last_error"]


def test_an_async_handler_uses_its_async_client_and_sees_should_stop(dsn: str, conn: psycopg.Connection) -> None:
    worker = async_worker()
    started = threading.Event()

    @worker.handler("long")
    async def long(job: Job, ctx: JobContext) -> int:
        assert isinstance(ctx.client, AsyncClient)
        follow_up = await ctx.client.enqueue("other", "follow_up", {"after": job.id})
        started.set()
        while not ctx.should_stop:
            await asyncio.sleep(0.01)
        return follow_up

    job_id = enqueue(conn, "long")
    with running(worker, dsn):
        assert started.wait(DEADLINE)
        worker.stop()
        wait_for(finished(conn, job_id), "the handler to stop early")
    row = job(conn, job_id)
    assert row["state"] == "done" and job(conn, row["result"])["payload"] == {"after": job_id}


def test_a_stop_at_once_cancels_async_handlers_and_leaves_their_jobs_to_the_lease(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = async_worker(shutdown_timeout=60.0)
    started, cancelled = threading.Event(), threading.Event()

    @worker.handler("forever")
    async def forever(job: Job, ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = enqueue(conn, "forever")
    with running(worker, dsn):
        assert started.wait(DEADLINE)
        stopped_at = time.monotonic()
        worker.stop(graceful=False)
    assert time.monotonic() - stopped_at < 10  # far below the 60 s a graceful stop would wait
    assert cancelled.is_set()
    assert (job(conn, job_id)["state"], [e[0] for e in events(conn, job_id)]) == ("running", ["claimed"])


def test_an_async_worker_runs_once_and_a_stop_before_run_returns_at_once(dsn: str) -> None:
    worker = async_worker()
    worker.stop()
    asyncio.run(asyncio.wait_for(worker.run(dsn, install_signal_handlers=False), DEADLINE))
    with pytest.raises(RuntimeError, match="AsyncWorker has already run"):
        asyncio.run(worker.run(dsn, install_signal_handlers=False))


# A plain handler that never returns, on an AsyncWorker stopped at once: the process exits
# anyway (the handler threads are daemons, as Worker's slots are), leaving the job to its lease.
STOP_AT_ONCE_WITH_A_STUCK_PLAIN_HANDLER = """
import asyncio, sys, threading
from pgq_thin import AsyncWorker
worker = AsyncWorker(["default"], concurrency=1, poll_interval=0.1)
started = threading.Event()

@worker.handler("stuck")
def stuck(job, ctx):
    started.set()
    threading.Event().wait()  # never returns

async def main():
    run = asyncio.create_task(worker.run(sys.argv[1], install_signal_handlers=False))
    while not started.is_set():
        await asyncio.sleep(0.01)
    worker.stop(graceful=False)
    await run

asyncio.run(main())
"""


def test_a_stop_at_once_does_not_wait_for_a_plain_handler_that_never_returns(
        dsn: str, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "stuck")
    proc = subprocess.run([sys.executable, "-c", STOP_AT_ONCE_WITH_A_STUCK_PLAIN_HANDLER, dsn],
                          capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    assert (job(conn, job_id)["state"], [e[0] for e in events(conn, job_id)]) == ("running", ["claimed"])
