"""Cancelling a running job reaches its handler at once (issue 27), on both runtimes.

pgq.cancel of a running job notifies channel pgq_cancel with '<id>:<attempt>'. The worker that runs
that attempt checks it (a renewal, refused for a cancelled job: any login may NOTIFY, so a
notification is a reason to look, never proof), then sets ctx.cancelled (and lease_lost, so
should_stop), interrupts an ``async def`` handler's task (asyncio.CancelledError) and discards the
handler's outcome quietly. Without the notification (no LISTEN, or its connection lost) the next
renewal ends the attempt as before: ctx.lease_lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from pgq_thin import Job
from pgq_thin.worker import AsyncWorker, JobContext
from pgq_thin.worker.held import CANCEL_CHECK_GAP, Held, HeldJobs, Verdict

from sqlhelpers import cancel, events, job, one, wait_for
from workerkit import DEADLINE, _current, enqueue, fast_worker, finished, running

#: Longer than any test here: the only renewal that can come during one is one a notification asks
#: for (the regular ones are due at a third of the lease).
LONG_LEASE = 3600.0


@pytest.fixture
def current_runtime(runtime: str) -> Iterator[str]:
    """The test runs on each runtime (conftest's runtime fixture; fast_worker makes the current one)."""
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


def running_attempt(conn: psycopg.Connection, job_id: int) -> int:
    return int(wait_for(lambda: job(conn, job_id)["state"] == "running" and job(conn, job_id)["attempt"],
                        f"job {job_id} to run"))


def took_in_cancel(logs: pytest.LogCaptureFixture, job_id: int) -> bool:
    """Whether the worker logged that it holds the cancel of ``job_id`` (held.py's end_renewal)."""
    return any(r.getMessage().startswith(f"job {job_id} ") and "cancelled while it ran" in r.getMessage()
               for r in list(logs.records))


def renewals_refused(conn: psycopg.Connection, job_id: int) -> int:
    return int(one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'"
                         " AND note LIKE 'renew %%'", (job_id,)))


@pytest.fixture
def no_errors(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The worker logs nothing at ERROR, and no warning about a cancel: it is an expected end."""
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    yield caplog
    loud = [r.getMessage() for r in caplog.records if r.name.startswith("pgq_thin.worker") and (
        r.levelno >= logging.ERROR or (r.levelno >= logging.WARNING and "no longer ours" in r.getMessage()))]
    assert loud == []


def listens(conn: psycopg.Connection) -> bool:
    """Whether a worker's listener connection has run its LISTEN pgq_cancel (its last statement is a
    LISTEN and it is idle); it may connect a while after the first job starts on a busy machine."""
    return conn.execute("SELECT FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name LIKE 'pgq-listen %' AND state = 'idle'"
                        " AND query LIKE 'LISTEN pgq%'").fetchone() is not None


@pytest.mark.usefixtures("current_runtime")
def test_a_cancel_tells_the_running_handler_at_once_and_its_outcome_is_discarded(
        dsn: str, conn: psycopg.Connection, no_errors: pytest.LogCaptureFixture) -> None:
    """A plain handler (in a thread on either runtime) is told cooperatively: ctx.cancelled,
    should_stop and lease_lost (its Event wakes the handler). The lease is an hour long: only
    the notification can have told it."""
    worker = fast_worker(lease=LONG_LEASE)
    calls: list[int] = []
    seen: dict[str, Any] = {}

    @worker.handler("long")
    def long(job: Job, ctx: JobContext) -> dict[str, str]:
        calls.append(job.id)
        seen["before"] = (ctx.cancelled, ctx.should_stop)
        seen["woken"] = ctx.lease_lost.wait(DEADLINE)
        seen["after"] = (ctx.cancelled, ctx.should_stop)
        return {"written": "by a cancelled attempt"}

    @worker.handler("quick")
    def quick(job: Job, ctx: JobContext) -> str:
        return "done"

    job_id = enqueue(conn, "long", max_attempts=3)
    with running(worker, dsn):
        wait_for(lambda: listens(conn), "the worker to LISTEN pgq_cancel")
        running_attempt(conn, job_id)
        wait_for(lambda: calls, "the handler to start")
        assert cancel(conn, job_id)
        wait_for(lambda: "after" in seen, "the handler to be told")
        other = enqueue(conn, "quick")  # the worker is unharmed
        wait_for(finished(conn, other), "the next job to run")

    assert seen["before"] == (False, False)
    assert seen["woken"] is True and seen["after"] == (True, True)
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["result"]) == ("cancelled", 1, None)
    assert calls == [job_id]  # it ran once: a cancelled job is never run again
    assert "completed" not in [e[0] for e in events(conn, job_id)]
    assert renewals_refused(conn, job_id) == 1  # the check the notification asked for
    assert job(conn, other)["state"] == "done"
    assert any("cancelled while it ran" in r.getMessage() for r in no_errors.records)


def test_an_async_handler_is_interrupted_with_cancelled_error_and_its_slot_runs_the_next_job(
        dsn: str, conn: psycopg.Connection, no_errors: pytest.LogCaptureFixture) -> None:
    # One slot: the next job runs in the same task.
    worker = AsyncWorker(["default"], concurrency=1, lease=LONG_LEASE, poll_interval=0.1, sweep_interval=1.0,
                         shutdown_timeout=10.0)
    seen: dict[str, Any] = {}

    @worker.handler("sleepy")
    async def sleepy(job: Job, ctx: JobContext) -> str:
        seen[job.id] = "started"
        try:
            await asyncio.sleep(DEADLINE)
        except asyncio.CancelledError:
            seen[job.id] = ("CancelledError", ctx.cancelled, ctx.should_stop)
            if job.payload.get("swallow"):
                return "caught it and returned"  # discarded: the job is cancelled
            raise
        return "slept"

    @worker.handler("timed")
    async def timed(job: Job, ctx: JobContext) -> str:
        # asyncio.timeout (3.11) sees the task's pending cancellations: ours must have been withdrawn.
        timeout = getattr(asyncio, "timeout", None)
        if timeout is None:
            await asyncio.wait_for(asyncio.sleep(0), 5)
        else:
            async with timeout(5):
                await asyncio.sleep(0)
        return "on time"

    raising = enqueue(conn, "sleepy")
    swallowing = enqueue(conn, "sleepy", '{"swallow": true}')
    after = enqueue(conn, "timed")
    with running(worker, dsn):
        wait_for(lambda: listens(conn), "the worker to LISTEN pgq_cancel")
        for job_id in (raising, swallowing):
            wait_for(lambda job_id=job_id: seen.get(job_id) == "started", f"job {job_id} to start")
            assert cancel(conn, job_id)
            wait_for(lambda job_id=job_id: seen[job_id] != "started", f"job {job_id}'s handler to be cancelled")
        wait_for(finished(conn, after), "the next job to run")

    assert seen[raising] == seen[swallowing] == ("CancelledError", True, True)
    assert [job(conn, j)["state"] for j in (raising, swallowing)] == ["cancelled", "cancelled"]
    assert job(conn, swallowing)["result"] is None
    assert (job(conn, after)["state"], job(conn, after)["result"]) == ("done", "on time")


@pytest.mark.usefixtures("current_runtime")
def test_a_job_cancelled_while_it_waits_for_a_slot_is_never_run(
        dsn: str, conn: psycopg.Connection, no_errors: pytest.LogCaptureFixture) -> None:
    worker = fast_worker(lease=LONG_LEASE, concurrency=1, prefetch=1)  # one runs, one waits for the slot
    release = threading.Event()
    ran: list[int] = []

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        ran.append(job.id)
        release.wait(DEADLINE)

    first = enqueue(conn, "hold")
    waiting = enqueue(conn, "hold")
    with running(worker, dsn):
        wait_for(lambda: listens(conn), "the worker to LISTEN pgq_cancel")
        try:
            running_attempt(conn, waiting)  # claimed (prefetched), its handler not started
            wait_for(lambda: ran == [first], "the first job to start")
            assert cancel(conn, waiting)
            wait_for(lambda: renewals_refused(conn, waiting), "the worker to check the cancel")
            # ... and to take the refusal in: the refused renewal is in the database before the
            # renewer has handled its answer, and a slot freed in between started the job.
            wait_for(lambda: took_in_cancel(no_errors, waiting), "the worker to take the cancel in")
        finally:
            release.set()
        wait_for(finished(conn, first), "the first job to end")

    assert ran == [first]
    assert (job(conn, first)["state"], job(conn, waiting)["state"]) == ("done", "cancelled")


@pytest.mark.usefixtures("current_runtime")
def test_a_cancel_racing_the_handlers_completion_ends_each_job_once_without_an_error(
        dsn: str, conn: psycopg.Connection, connect: Any, no_errors: pytest.LogCaptureFixture) -> None:
    """The handler returns the moment the cancel is sent: either the completion commits first
    (done, the cancel answers false) or the cancel does (cancelled, the completion is refused
    or not sent). Whichever wins, the job is terminal, it ran once, and nothing is logged as an
    error."""
    worker = fast_worker(lease=LONG_LEASE, concurrency=4)
    gates: dict[int, threading.Event] = {}
    calls: list[int] = []

    @worker.handler("race")
    def race(job: Job, ctx: JobContext) -> dict[str, int]:
        calls.append(job.id)
        gates[job.id].wait(DEADLINE)
        return {"n": job.id}  # a result: one pgq.complete of its own, racing the cancel

    @worker.handler("race_batched")
    def race_batched(job: Job, ctx: JobContext) -> None:
        calls.append(job.id)
        gates[job.id].wait(DEADLINE)  # None: its completion joins a complete_many batch

    canceller = connect()
    ids = [enqueue(conn, "race" if n % 2 else "race_batched") for n in range(12)]
    for job_id in ids:
        gates[job_id] = threading.Event()
    answers: dict[int, bool] = {}
    with running(worker, dsn):
        for job_id in ids:
            wait_for(lambda job_id=job_id: job_id in calls, f"job {job_id} to start")
            gates[job_id].set()
            answers[job_id] = cancel(canceller, job_id)
            wait_for(finished(conn, job_id), f"job {job_id} to end")

    assert sorted(calls) == sorted(ids)  # each ran once
    for job_id in ids:
        row = job(conn, job_id)
        assert row["state"] == ("cancelled" if answers[job_id] else "done"), (job_id, answers[job_id], row)
        ends = [e for e in events(conn, job_id) if e[0] in ("completed", "cancelled")]
        assert len(ends) == 1, ends
        if row["state"] == "done" and row["kind"] == "race":
            assert row["result"] == {"n": job_id}


@pytest.mark.usefixtures("current_runtime")
def test_a_notification_for_a_job_still_ours_is_checked_and_ignored(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    """Any login may NOTIFY pgq_cancel: a notification naming a running attempt that was not
    cancelled costs one renewal (granted) and changes nothing; malformed ones are ignored."""
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    worker = fast_worker(lease=LONG_LEASE)
    release = threading.Event()
    seen: list[tuple[bool, bool]] = []

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> str:
        release.wait(DEADLINE)
        seen.append((ctx.cancelled, ctx.should_stop))
        return "finished"

    job_id = enqueue(conn, "hold")
    with running(worker, dsn):
        wait_for(lambda: listens(conn), "the worker to LISTEN pgq_cancel")
        try:
            attempt = running_attempt(conn, job_id)
            lease_before = job(conn, job_id)["lease_until"]
            for payload in ("junk", f"{job_id}", f"{job_id}:x", f"-{job_id}:{attempt}", f"{job_id}:{attempt + 1}",
                            f"{job_id}:{attempt}"):
                conn.execute("SELECT pg_notify('pgq_cancel', %s)", (payload,))
            wait_for(lambda: job(conn, job_id)["lease_until"] > lease_before, "the worker to renew the lease")
            wait_for(lambda: any("notification is ignored" in r.getMessage() for r in caplog.records),
                     "the worker to say it ignored the notification")
        finally:
            release.set()
        wait_for(finished(conn, job_id), "the job to end")

    assert seen == [(False, False)]
    assert (job(conn, job_id)["state"], job(conn, job_id)["result"]) == ("done", "finished")
    assert renewals_refused(conn, job_id) == 0


@pytest.mark.usefixtures("current_runtime")
def test_with_the_listen_connection_lost_a_cancel_still_ends_the_handler_at_its_next_renewal(
        dsn: str, conn: psycopg.Connection, admin_dsn: str) -> None:
    """The notification is lost (nobody LISTENs when the cancel commits: new connections to the
    database are refused meanwhile, so the listener cannot come back): the next renewal is
    refused and the handler is told by ctx.lease_lost, as before issue 27."""
    worker = fast_worker(lease=2.0)  # renewed about every 0.7 s
    seen: dict[str, Any] = {}
    listening = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                 " AND application_name LIKE 'pgq-listen %'")

    @worker.handler("long")
    def long(job: Job, ctx: JobContext) -> None:
        seen["started"] = True
        seen["lost"] = ctx.lease_lost.wait(DEADLINE)
        seen["cancelled"] = ctx.cancelled

    job_id = enqueue(conn, "long")
    database = one(conn, "SELECT current_database()")
    with running(worker, dsn):
        wait_for(lambda: seen.get("started") and listens(conn), "the job to run and the worker to LISTEN")
        admin = psycopg.connect(admin_dsn, autocommit=True)  # (a database cannot refuse connections to itself)
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            pid = one(conn, listening)
            assert one(conn, "SELECT pg_terminate_backend(%s, 10000)", (pid,))  # waits until it has exited
            assert conn.execute(listening).fetchall() == []
            assert cancel(conn, job_id)
            wait_for(lambda: "lost" in seen, "the handler to be told")
        finally:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            admin.close()

    assert (seen["lost"], seen["cancelled"]) == (True, False)
    assert job(conn, job_id)["state"] == "cancelled"
    assert renewals_refused(conn, job_id) >= 1


@pytest.mark.parametrize("outermost", ["plain", "async"])
def test_an_async_handler_under_middleware_is_interrupted_and_every_part_sees_the_cancel(
        dsn: str, conn: psycopg.Connection, outermost: str, no_errors: pytest.LogCaptureFixture) -> None:
    """A chain that passes between the loop and a handler thread: the async handler's task is
    cancelled, an async middleware sees asyncio.CancelledError, a plain one (in its thread) the
    cancel as an exception from call_next(); then the slot runs the next job."""
    worker = AsyncWorker(["default"], concurrency=1, lease=LONG_LEASE, poll_interval=0.1, sweep_interval=1.0,
                         shutdown_timeout=10.0)
    trail: list[str] = []

    def plain(job: Job, ctx: JobContext, call_next: Any) -> Any:
        try:
            return call_next()
        except BaseException as exc:
            trail.append(f"plain middleware: {type(exc).__name__}, cancelled {ctx.cancelled}")
            raise

    async def on_loop(job: Job, ctx: JobContext, call_next: Any) -> Any:
        try:
            return await call_next()
        except asyncio.CancelledError:
            trail.append(f"async middleware: CancelledError, cancelled {ctx.cancelled}")
            raise

    for middleware in ((plain, on_loop) if outermost == "plain" else (on_loop, plain)):
        worker.middleware(middleware)

    @worker.handler("sleepy")
    async def sleepy(job: Job, ctx: JobContext) -> str:
        if job.payload.get("quick"):
            return "quick"
        trail.append("handler started")
        try:
            await asyncio.sleep(DEADLINE)
        except asyncio.CancelledError:
            trail.append("handler: CancelledError")
            raise
        return "slept"

    job_id = enqueue(conn, "sleepy")
    with running(worker, dsn):
        wait_for(lambda: listens(conn), "the worker to LISTEN pgq_cancel")
        wait_for(lambda: "handler started" in trail, "the handler to start")
        assert cancel(conn, job_id)
        wait_for(lambda: len(trail) == 4, "every part to see the cancel")
        after = enqueue(conn, "sleepy", '{"quick": true}')
        wait_for(finished(conn, after), "the next job")

    inner_first = ["async middleware: CancelledError, cancelled True",
                   "plain middleware: CancelledError, cancelled True"]
    if outermost == "async":
        inner_first.reverse()
    assert trail == ["handler started", "handler: CancelledError", *inner_first]
    assert job(conn, job_id)["state"] == "cancelled"
    assert (job(conn, after)["state"], job(conn, after)["result"]) == ("done", "quick")


# The registry's rules, without a database ----------------------------------------------------------


def held_job(registry: HeldJobs, job_id: int = 7, attempt: int = 1) -> Held:
    now = datetime.now(timezone.utc)
    claimed = Job(id=job_id, queue="q", kind="k", payload={}, priority=0, attempt=attempt, max_attempts=3,
                  run_at=now, created_at=now, lease_until=now, tenant=None)
    return registry.hold(claimed, JobContext(claimed, None, "w"), LONG_LEASE)


def renewal(registry: HeldJobs, held: Held, *, refused: bool = False, answered: bool = True) -> None:
    assert registry.begin_renewal(held)
    registry.end_renewal(held, lost=refused, answered=answered)


def test_a_notification_makes_the_renewal_due_now_and_a_flood_of_them_one_per_gap() -> None:
    registry = HeldJobs()
    held = held_job(registry)
    assert held.next_renew > time.monotonic() + 1000  # a third of an hour away
    assert not registry.notice_cancel(7, 2) and not registry.notice_cancel(8, 1)  # not an attempt we hold
    assert held.next_renew > time.monotonic() + 1000
    before = time.monotonic()
    assert registry.notice_cancel(7, 1)
    assert held.next_renew <= time.monotonic()
    renewal(registry, held)  # granted: the notification was not a cancel
    held.next_renew = time.monotonic() + 1000  # (what renewed() sets when it is granted)
    for _ in range(100):
        registry.notice_cancel(7, 1)
    assert before + CANCEL_CHECK_GAP <= held.next_renew <= time.monotonic() + CANCEL_CHECK_GAP
    assert not held.ctx.cancelled and not held.ctx.should_stop


def test_a_renewal_refused_after_a_notification_is_a_cancel_not_a_lost_lease() -> None:
    registry = HeldJobs()
    lost: list[int] = []
    interrupted: list[Held] = []
    registry.on_lost = lambda: lost.append(1)
    registry.on_cancelled = interrupted.append
    held, other = held_job(registry, 7), held_job(registry, 8)
    registry.notice_cancel(7, 1)
    renewal(registry, held, answered=False)  # it did not reach the server: the next one asks again
    assert not held.ctx.cancelled
    renewal(registry, held, refused=True)
    assert (held.ctx.cancelled, held.ctx.lease_lost.is_set(), held.ctx.should_stop) == (True, True, True)
    assert interrupted == [held] and lost == []
    assert registry.settle(held) is Verdict.GONE  # its outcome is never sent
    renewal(registry, other, refused=True)  # no notification named it: a lost lease
    assert (other.ctx.cancelled, other.ctx.lease_lost.is_set(), lost) == (False, True, [1])


def test_a_notification_during_a_renewal_in_flight_makes_the_next_one_due_at_once() -> None:
    registry = HeldJobs()
    held = held_job(registry)
    assert registry.begin_renewal(held)  # a regular renewal, begun before the cancel committed
    registry.notice_cancel(7, 1)
    held.next_renew = time.monotonic() + 1000  # (what renewed() sets when it is granted)
    registry.end_renewal(held)
    assert held.next_renew <= time.monotonic() + CANCEL_CHECK_GAP
    renewal(registry, held, refused=True)
    assert held.ctx.cancelled
