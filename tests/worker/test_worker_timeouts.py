"""The worker and execution timeouts / progress checkpoints (issue 15).

A job with max_run_time has a deadline (ctx.deadline, the database's claimed_at + max_run_time).
The worker stops renewing at it, sets ctx.should_stop (and ctx.lease_lost), and discards the
handler's late outcome: the database's recovery ends the attempt as timed_out. ctx.progress({...})
stores a checkpoint that the next attempt finds in job.progress.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgq_thin import Client, Job
from pgq_thin.worker import JobContext

from sqlhelpers import events, job, one, wait_for
from workerkit import _current, enqueue, fast_worker, finished, running
from workerprocess import ROOT, spawner

SLEEPY = ROOT / "tests" / "apps" / "sleepy.py"


@pytest.fixture
def both_runtimes(runtime: str) -> Iterator[str]:
    """The deadline lives in the parts both runtimes share: run the test on each (conftest's
    runtime fixture; fast_worker makes the current one)."""
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


@pytest.mark.usefixtures("both_runtimes")
def test_the_handler_knows_its_deadline_should_stop_turns_true_at_it_and_the_late_outcome_is_discarded(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(lease=5)
    seen: dict[str, Any] = {}

    @worker.handler("slow")
    def slow(job: Job, ctx: JobContext) -> dict[str, bool]:
        seen["deadline"] = ctx.deadline
        seen["job_deadline"] = job.deadline
        seen["stop_at_start"] = ctx.should_stop
        while not ctx.should_stop:
            time.sleep(0.01)
        seen["stopped_at"] = datetime.now(timezone.utc)
        seen["lease_lost"] = ctx.lease_lost.is_set() or ctx.lease_lost.wait(2)
        return {"late": True}  # after the deadline: must not be recorded

    job_id = enqueue(conn, "slow", max_run_time="1 second", max_attempts=1)
    with running(worker, dsn):
        wait_for(lambda: "stopped_at" in seen, "the handler to see should_stop")
        wait_for(finished(conn, job_id), "the recovery to end the attempt")
    row = job(conn, job_id)
    assert seen["deadline"] == seen["job_deadline"] == row["deadline"]
    assert (row["deadline"] - row["claimed_at"]).total_seconds() == 1
    assert seen["stop_at_start"] is False
    # should_stop turned true at the deadline, not before it (this machine's clock is the server's).
    assert (seen["stopped_at"] - row["deadline"]).total_seconds() > -0.2
    assert seen["lease_lost"] is True
    assert (row["state"], row["last_event"], row["last_error"], row["result"]) == (
        "failed", "timed_out", "timed out after 00:00:01", None)
    # The worker sent no completion for the late outcome (a sent one would be a 'rejected' event).
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "timed_out"]


@pytest.mark.usefixtures("both_runtimes")
def test_a_job_without_max_run_time_has_no_deadline_and_is_renewed_as_before(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(lease=0.6)
    seen: dict[str, Any] = {}

    @worker.handler("work")
    def work(job: Job, ctx: JobContext) -> dict[str, bool]:
        seen["deadline"] = ctx.deadline
        time.sleep(1.5)  # more than two leases: renewed meanwhile
        seen["should_stop"] = ctx.should_stop
        return {"ok": True}

    job_id = enqueue(conn, "work")
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to finish")
    assert seen == {"deadline": None, "should_stop": False}
    assert (job(conn, job_id)["state"], job(conn, job_id)["result"]) == ("done", {"ok": True})


def test_ctx_progress_stores_a_checkpoint_that_the_next_attempt_resumes_from(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()
    seen: list[tuple[int, Any, bool]] = []

    @worker.handler("import")
    def import_rows(job: Job, ctx: JobContext) -> dict[str, int]:
        start = (job.progress or {}).get("rows", 0)
        if job.attempt == 1:
            seen.append((job.attempt, job.progress, ctx.progress({"rows": start + 500})))
            raise RuntimeError("connection reset after 500 rows")
        seen.append((job.attempt, job.progress, ctx.progress({"rows": start + 300})))
        return {"rows": start + 300}

    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '10 milliseconds', "
                 "backoff_cap => '10 milliseconds')")
    job_id = enqueue(conn, "import")
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to finish")
    assert seen == [(1, None, True), (2, {"rows": 500}, True)]
    row = job(conn, job_id)
    assert (row["state"], row["result"], row["progress"]) == ("done", {"rows": 800}, {"rows": 800})
    # A stale attempt's progress is refused, and tells the handler the job is not its own.
    stale = Job(id=job_id, queue="default", kind="import", payload={}, priority=0, attempt=1, max_attempts=25,
                run_at=row["run_at"], created_at=row["created_at"], lease_until=row["run_at"], tenant=None)
    with Client(dsn) as client:
        ctx = JobContext(job=stale, client=client, worker_name="w")
        assert ctx.progress({"rows": 0}) is False
    assert ctx.lease_lost.is_set() and ctx.should_stop
    assert job(conn, job_id)["progress"] == {"rows": 800}


def test_a_real_worker_process_whose_handler_hangs_is_ended_by_its_timeout(
        dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """tests/apps/sleepy.py sleeps payload["seconds"] without looking at ctx (a hung handler)
    while its renewer would renew the lease forever. With max_run_time 1 s the attempt ends at
    its deadline, long before the handler returns, and the handler's late result is discarded."""
    job_id = enqueue(conn, "sleep", '{"seconds": 8}', max_run_time="1 second", max_attempts=1)
    with spawner(SLEEPY, dsn, tmp_path) as spawn:
        worker = spawn(SLEEPY_LEASE="0.6")
        wait_for(lambda: worker.logged(f"sleeping 8s for job {job_id}"), "the handler to start")
        wait_for(finished(conn, job_id), "the worker's sweep to end the timed-out attempt")
        row = job(conn, job_id)
        assert (row["state"], row["last_event"], row["last_error"]) == ("failed", "timed_out",
                                                                        "timed out after 00:00:01")
        timed_out_at = one(conn, "SELECT at FROM pgq.job_events WHERE job_id = %s AND event = 'timed_out'", (job_id,))
        # Ended by its deadline (the worker sweeps every second), long before the handler returns
        # (8 s after the claim), and while it is still sleeping.
        assert (timed_out_at - row["claimed_at"]).total_seconds() < 6.0
        assert not worker.logged("outcome is discarded")
        wait_for(lambda: worker.logged("outcome is discarded"), "the handler to return and its outcome to be dropped")
        assert worker.stop() == 0
    assert worker.logged("deadline")
    row = job(conn, job_id)
    assert (row["state"], row["result"]) == ("failed", None)
    # No completion was sent for the late outcome (a sent one would be a 'rejected' event).
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "timed_out"]
