"""The worker runtimes against a real PostgreSQL, with the worker running in a thread of the test.

Each test runs a Worker with ``run(install_signal_handlers=False)`` (or an AsyncWorker, in an
event loop of its own) in a background thread and watches the database from the test's own
connection. Every test runs against both runtimes: the handlers here are plain functions, which
an AsyncWorker runs in threads; test_async_worker.py has the ``async def`` handlers. The crash and
signal scenarios, which need a real process, are in test_worker_processes.py.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgq_thin import Client, Job
from pgq_thin.errors import PgqError
from pgq_thin.worker import AUTO_PREFETCH_MAX, JobContext, OutcomeUnknown, Retry, Snooze, Worker
from pgq_thin.worker.claimer import ClaimNudge, PollTimer
from pgq_thin.worker.held import HeldJobs
from pgq_thin.worker.support import Flags, transient
from pgq_thin.worker.threads.completer import Completer
from pgq_thin.worker.threads.owner import OwnerCalls

from sqlhelpers import LOWER_LEASE_FLOOR, events, expire_lease, job, one, take_over, wait_for
from workerkit import DEADLINE, _current, enqueue, fast_worker, finished, running, state_counts


@pytest.fixture(autouse=True)
def current_runtime(runtime: str) -> Iterator[str]:
    """Every test here runs on each runtime (conftest's runtime fixture); fast_worker() makes the
    current one."""
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


# What a handler's outcome does ------------------------------------------------------------------


def test_a_handlers_return_value_completes_the_job_with_that_result(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()
    seen: list[tuple[int, str]] = []

    @worker.handler("add")
    def add(job: Job, ctx: JobContext) -> dict[str, int]:
        seen.append((job.attempt, ctx.worker_name))
        return {"sum": job.payload["a"] + job.payload["b"]}

    assert add is worker._handlers["add"]  # the decorator returns the function unchanged
    job_id = enqueue(conn, "add", '{"a": 2, "b": 3}')
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to finish")

    row = job(conn, job_id)
    assert row["state"] == "done"
    assert row["result"] == {"sum": 5}
    assert row["attempt"] == 1
    assert seen == [(1, worker.name)]
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "completed"]


def test_a_handler_exception_fails_the_attempt_with_its_traceback_and_a_backoff(
        dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '1 minute', backoff_cap => '1 hour')")
    worker = fast_worker()

    @worker.handler("explode")
    def explode(job: Job, ctx: JobContext) -> None:
        raise RuntimeError("the mail server said no")

    job_id = enqueue(conn, "explode")
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["last_event"] == "failed", "the attempt to fail")

    row = job(conn, job_id)
    assert row["state"] == "pending"  # attempts are left: retried after the backoff
    assert row["attempt"] == 1
    assert "Traceback (most recent call last)" in row["last_error"]
    assert "RuntimeError: the mail server said no" in row["last_error"]
    assert "in explode" in row["last_error"]
    # The queue's backoff after attempt 1 is in [base/2, base]... never below base: at least 1 minute.
    assert one(conn, "SELECT run_at - now() > interval '50 seconds' FROM pgq.jobs WHERE id = %s", (job_id,))


def test_retry_fails_the_attempt_and_runs_it_again_after_the_given_delay(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()

    @worker.handler("later")
    def later(job: Job, ctx: JobContext) -> None:
        raise Retry(120, reason="rate limited by the provider")

    job_id = enqueue(conn, "later")
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["last_event"] == "failed", "the attempt to fail")

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["last_error"]) == ("pending", 1, "rate limited by the provider")
    delay = one(conn, "SELECT extract(epoch FROM run_at - now()) FROM pgq.jobs WHERE id = %s", (job_id,))
    assert 100 < delay <= 120


def test_retry_without_a_delay_uses_the_queues_backoff(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '10 minutes', backoff_cap => '1 hour')")
    worker = fast_worker()

    @worker.handler("later")
    def later(job: Job, ctx: JobContext) -> None:
        raise Retry()

    job_id = enqueue(conn, "later")
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["last_event"] == "failed", "the attempt to fail")

    assert job(conn, job_id)["last_error"] == "retry requested"
    assert one(conn, "SELECT run_at - now() > interval '9 minutes' FROM pgq.jobs WHERE id = %s", (job_id,))


def test_snooze_puts_the_job_back_without_using_up_an_attempt(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()

    @worker.handler("wait")
    def wait(job: Job, ctx: JobContext) -> None:
        raise Snooze(300)

    job_id = enqueue(conn, "wait", max_attempts=3)
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["last_event"] == "snoozed", "the job to be snoozed")

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["max_attempts"]) == ("pending", 1, 4)
    assert row["last_error"] is None
    delay = one(conn, "SELECT extract(epoch FROM run_at - now()) FROM pgq.jobs WHERE id = %s", (job_id,))
    assert 280 < delay <= 300


def test_outcome_unknown_parks_the_job_with_the_note(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()

    @worker.handler("charge")
    def charge(job: Job, ctx: JobContext) -> None:
        raise OutcomeUnknown("payment API timed out after the request was sent; check order 42")

    job_id = enqueue(conn, "charge")
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to be parked")

    row = job(conn, job_id)
    assert row["state"] == "outcome_unknown"
    assert row["last_error"] == "payment API timed out after the request was sent; check order 42"
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "marked_unknown"]


def test_a_job_of_a_kind_without_handler_waits_untouched_for_a_worker_that_has_one(
        dsn: str, conn: psycopg.Connection) -> None:
    # A rolling deploy: the old worker knows only "known"; the new kind's job must survive it.
    old = fast_worker(name="old")

    @old.handler("known")
    def known(job: Job, ctx: JobContext) -> None:
        return None

    mystery = enqueue(conn, "mystery", priority=10)  # first in line
    plain = enqueue(conn, "known")
    with running(old, dsn):
        wait_for(finished(conn, plain), "the known job to be done")
    row = job(conn, mystery)
    assert (row["state"], row["attempt"], row["claimed_by"]) == ("pending", 0, None)

    new = fast_worker(name="new")
    new.handler("known")(known)

    @new.handler("mystery")
    def solved(job: Job, ctx: JobContext) -> dict[str, bool]:
        return {"solved": True}

    with running(new, dsn):
        wait_for(finished(conn, mystery), "the new worker to run it")
    row = job(conn, mystery)
    assert (row["state"], row["attempt"], row["claimed_by"], row["result"]) == ("done", 1, "new", {"solved": True})


def test_a_dependant_whose_enqueue_overlapped_its_dependencys_end_runs_without_waiting_for_a_sweep(
        dsn: str, conn: psycopg.Connection) -> None:
    """Issue 37: the README's workflow pattern (the dependant enqueued in its own call after its
    dependency) raced with the dependency's end: neither transaction saw the other, and the
    release waited for a sweep (30 s by default). The worker settles such overlaps about once a
    second (pgq.settle_dependencies); here its sweeps are off, so only that releases it."""
    dependency = enqueue(conn, "first", queue="deps")
    attempt = one(conn, "SELECT attempt FROM pgq.claim('w', ARRAY['deps'])")
    with psycopg.connect(dsn) as ender, psycopg.connect(dsn) as producer:
        ender.execute("SELECT pgq.complete(%s, %s)", (dependency, attempt))
        dependant = one(producer, "SELECT pgq.enqueue('default', 'after', depends_on => %s)", ([dependency],))
        ender.commit()
        producer.commit()
    assert (job(conn, dependency)["state"], job(conn, dependant)["state"]) == ("done", "waiting")

    worker = fast_worker(sweep_interval=0)

    @worker.handler("after")
    def after(job: Job, ctx: JobContext) -> None:
        return None

    with running(worker, dsn):
        wait_for(lambda: job(conn, dependant)["state"] == "done", "the worker to settle the overlap and run it")


def test_a_worker_without_handlers_claims_nothing(dsn: str, conn: psycopg.Connection,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    job_id = enqueue(conn, "anything")
    # A job whose lease expired: the worker's loop sweeps it back (so the loop has run), then
    # claims nothing, neither it nor the other one.
    stale = enqueue(conn, "anything")
    conn.execute("UPDATE pgq.jobs SET state = 'running', attempt = 1, lease_until = now() - interval '1 s',"
                 " claimed_at = now() WHERE id = %s", (stale,))
    conn.execute(LOWER_LEASE_FLOOR)
    worker = fast_worker(sweep_interval=0.2)
    with running(worker, dsn):
        wait_for(lambda: job(conn, stale)["state"] == "pending", "the worker's loop to sweep the stale job back")
    assert job(conn, job_id)["attempt"] == 0 and job(conn, stale)["attempt"] == 1
    assert any("no handlers registered: this worker claims nothing" in r.getMessage() for r in caplog.records)


def test_the_worker_warns_at_start_about_queues_that_do_not_exist_or_are_paused(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    conn.execute("SELECT pgq.enqueue('emails', 'k')")
    conn.execute("SELECT pgq.configure_queue('sms')")
    conn.execute("SELECT pgq.pause('sms')")
    worker = fast_worker()

    @worker.handler("k")
    def k(job: Job, ctx: JobContext) -> None:
        return None

    with running(worker, dsn, queues=["emails", "emials", "sms"]):
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 1, "the job")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("queue emials does not exist (yet)") for m in warnings), warnings
    assert any(m.startswith("queue sms is paused") for m in warnings), warnings
    assert not any("queue emails" in m for m in warnings), warnings


def test_a_result_that_is_not_json_fails_the_job_without_retry(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()

    @worker.handler("odd")
    def odd(job: Job, ctx: JobContext) -> object:
        return {"when": object()}

    job_id = enqueue(conn, "odd")
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to fail")

    row = job(conn, job_id)
    assert row["state"] == "failed"
    assert "complete of this attempt was refused" in row["last_error"]
    assert "not JSON serializable" in row["last_error"]


def test_a_failed_attempt_is_logged_once_with_its_traceback_and_what_became_of_it(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    # One line per failed attempt, written when the server has answered the fail: the exception,
    # its traceback, and whether the job will be retried (not a WARNING, then an INFO).
    caplog.set_level(logging.DEBUG, logger="pgq_thin.worker")
    worker = fast_worker()

    @worker.handler("flaky")
    def flaky(job: Job, ctx: JobContext) -> None:
        raise ValueError(f"broken on attempt {job.attempt}")

    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '10 ms', backoff_cap => '10 ms')")
    job_id = enqueue(conn, "flaky", max_attempts=2)
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to fail twice")
    assert job(conn, job_id)["state"] == "failed"
    about = [r for r in caplog.records if r.getMessage().startswith(f"job {job_id} ")]
    failures = [r for r in about if "broken on attempt" in r.getMessage() or r.exc_info]
    assert [(r.levelno, r.getMessage().split(": ", 1)[1]) for r in failures] == [
        (logging.WARNING, "the handler raised ValueError('broken on attempt 1'); "
                          "failed; it will be retried after its backoff"),
        (logging.WARNING, "the handler raised ValueError('broken on attempt 2'); "
                          "failed for good: no attempts left, or not retryable"),
    ]
    assert all(r.exc_info and "raise ValueError" in caplog.handler.format(r) for r in failures)
    assert not [r for r in about if r not in failures and "failed" in r.getMessage()], \
        [r.getMessage() for r in about]


def test_retry_and_snooze_refuse_a_delay_that_is_not_positive() -> None:
    with pytest.raises(ValueError):
        Retry(0)
    with pytest.raises(ValueError):
        Snooze(-1)


# Slots ------------------------------------------------------------------------------------------


def test_four_slots_run_four_jobs_at_the_same_time(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=4)
    release = threading.Event()

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        release.wait(DEADLINE)

    conn.execute("SELECT pgq.enqueue_many('default', 'hold', array_fill('{}'::jsonb, array[4]))")
    with running(worker, dsn):
        wait_for(lambda: state_counts(conn).get("running") == 4, "four jobs running at once")
        release.set()
        wait_for(lambda: state_counts(conn) == {"done": 4}, "all four jobs done")

    assert one(conn, "SELECT count(DISTINCT claimed_by) FROM pgq.jobs") == 1


def test_without_prefetch_each_claim_asks_for_as_many_jobs_as_there_are_free_slots(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=4, prefetch=0)
    gates = {n: threading.Event() for n in range(1, 7)}

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        gates[job.payload["n"]].wait(DEADLINE)

    ids = [r[0] for r in conn.execute(
        "SELECT pgq.enqueue_many('default', 'hold', array_agg(jsonb_build_object('n', n) ORDER BY n))"
        " FROM generate_series(1, 6) AS n").fetchall()]

    def rows() -> dict[int, dict[str, Any]]:
        return {n: job(conn, job_id) for n, job_id in enumerate(ids, start=1)}

    with running(worker, dsn):
        # Four free slots: one claim takes four jobs (one statement: the same claimed_at).
        wait_for(lambda: state_counts(conn).get("running") == 4, "four jobs running")
        first = rows()
        assert [first[n]["state"] for n in range(1, 7)] == ["running"] * 4 + ["pending"] * 2
        assert len({first[n]["claimed_at"] for n in range(1, 5)}) == 1

        # One slot frees: the next claim asks for one job. Had it asked for more, job 6 would have
        # been claimed by the same statement as job 5.
        gates[1].set()
        wait_for(lambda: job(conn, ids[4])["state"] == "running", "job 5 to be claimed")
        assert job(conn, ids[5])["state"] == "pending"
        # Job 1's completion goes out with the completer's next complete_many, which may come a
        # moment after its slot took job 5: wait for it (job 6 stays pending all along).
        wait_for(lambda: state_counts(conn) == {"done": 1, "running": 4, "pending": 1}, "job 1 recorded done")

        gates[2].set()
        wait_for(lambda: job(conn, ids[5])["state"] == "running", "job 6 to be claimed")
        for gate in gates.values():
            gate.set()
        wait_for(lambda: state_counts(conn) == {"done": 6}, "all jobs done")


def swept(conn: psycopg.Connection, times: int) -> None:
    """Wait until the running worker's periodic pgq.sweep has run ``times`` times: each time a decoy
    job of a queue the worker does not serve is claimed here with an expired lease, and only a
    sweep makes it pending again. The worker sweeps from its claim loop, between claim decisions,
    so two sweeps mean the loop went round at least once in between."""
    decoy = enqueue(conn, "decoy", queue="elsewhere")
    for n in range(times):
        assert conn.execute("SELECT id FROM pgq.claim('test', '{elsewhere}', 1)").fetchone() == (decoy,)
        expire_lease(conn, decoy)
        wait_for(lambda: job(conn, decoy)["state"] == "pending", f"the worker's sweep number {n + 1}")


def test_with_prefetch_a_claim_also_takes_jobs_that_wait_for_a_slot(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=2, prefetch=3, sweep_interval=0.2)
    release = threading.Event()
    lock = threading.Lock()
    inside = {"now": 0, "most": 0}

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        with lock:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])
        release.wait(DEADLINE)
        with lock:
            inside["now"] -= 1

    conn.execute("SELECT pgq.enqueue_many('default', 'hold', array_fill('{}'::jsonb, array[10]))")
    with running(worker, dsn):
        # Two slots and three places to wait: one claim of five jobs (one statement: one claimed_at).
        wait_for(lambda: state_counts(conn).get("running") == 5, "five jobs claimed")
        assert one(conn, "SELECT count(DISTINCT claimed_at) FROM pgq.jobs WHERE state = 'running'") == 1
        swept(conn, 2)  # the claim loop went round with all five held ...
        held = dict(conn.execute("SELECT state::text, count(*) FROM pgq.jobs WHERE queue = 'default'"
                                 " GROUP BY 1").fetchall())
        assert held == {"running": 5, "pending": 5}  # ... and claimed nothing more
        release.set()
        wait_for(lambda: state_counts(conn) == {"done": 10, "pending": 1}, "all jobs done")
    assert inside["most"] == 2  # never more handlers at once than slots


def test_a_graceful_stop_gives_back_the_jobs_waiting_for_a_slot_at_once(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=1, prefetch=3)
    started = threading.Event()
    release = threading.Event()

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> str:
        started.set()
        release.wait(DEADLINE)
        return "finished"

    ids = [r[0] for r in conn.execute(
        "SELECT pgq.enqueue_many('default', 'hold', array_fill('{}'::jsonb, array[4]))").fetchall()]
    with running(worker, dsn):
        wait_for(lambda: state_counts(conn).get("running") == 4, "four jobs claimed")
        assert started.wait(DEADLINE)
        worker.stop()
        # The three that never started are given back while the first still runs.
        wait_for(lambda: state_counts(conn) == {"running": 1, "pending": 3}, "the waiting jobs given back")
        release.set()
    assert state_counts(conn) == {"done": 1, "pending": 3}
    given_back = conn.execute("SELECT id FROM pgq.jobs WHERE state = 'pending' ORDER BY id").fetchall()
    for (job_id,) in given_back:
        assert [e[0] for e in events(conn, job_id)] == ["claimed", "released"]
    assert len(set(ids) - {r[0] for r in given_back}) == 1


def largest_claim(conn: psycopg.Connection) -> int:
    """The most jobs one claim statement took (one statement: one claimed_at)."""
    return one(conn, "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pgq.jobs"
                     " WHERE claimed_at IS NOT NULL GROUP BY claimed_at) AS c")


def test_by_default_a_worker_of_short_jobs_claims_more_than_its_free_slots(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=2)  # prefetch "auto", the default
    assert worker.prefetch == "auto"

    @worker.handler("quick")
    def quick(job: Job, ctx: JobContext) -> None:
        return None

    conn.execute("SELECT pgq.enqueue_many('default', 'quick', array_fill('{}'::jsonb, array[400]))")
    with running(worker, dsn):
        wait_for(lambda: state_counts(conn) == {"done": 400}, "all jobs done")
    # The first claim asks for the two free slots (nothing is measured yet); once jobs are seen to
    # take far less than the waiting budget, claims take jobs that wait for a slot too.
    assert largest_claim(conn) > 2


def test_by_default_claims_grow_past_the_first_cap_while_the_backlog_stays_deep(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=2)  # prefetch "auto", the default

    @worker.handler("quick")
    def quick(job: Job, ctx: JobContext) -> None:
        return None

    conn.execute("SELECT pgq.enqueue_many('default', 'quick', array_fill('{}'::jsonb, array[3000]))")
    with running(worker, dsn):
        wait_for(lambda: state_counts(conn) == {"done": 3000}, "all jobs done", timeout=60)
    # Free slots plus AUTO_PREFETCH_MAX at first; each claim that came back full let the next one
    # take more (up to AUTO_PREFETCH_DEEP waiting).
    assert largest_claim(conn) > 2 + AUTO_PREFETCH_MAX


def test_by_default_a_worker_of_long_jobs_claims_only_its_free_slots(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=2)
    lock = threading.Lock()
    inside = {"now": 0, "most": 0}
    pair = threading.Barrier(2)  # both slots busy at once, every time: not left to sampling

    @worker.handler("slow")
    def slow(job: Job, ctx: JobContext) -> str:  # a result: recorded before the slot frees
        with lock:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])
        pair.wait(DEADLINE)
        time.sleep(0.3)  # the work: longer than the waiting budget, so prefetching would make jobs wait
        with lock:
            inside["now"] -= 1
        return "ok"

    conn.execute("SELECT pgq.enqueue_many('default', 'slow', array_fill('{}'::jsonb, array[8]))")
    most_held = 0
    with running(worker, dsn):
        deadline = time.monotonic() + DEADLINE
        while state_counts(conn) != {"done": 8} and time.monotonic() < deadline:
            most_held = max(most_held, state_counts(conn).get("running", 0))
            time.sleep(0.02)
    assert state_counts(conn) == {"done": 8}
    # Never more claimed than slots: by the claims themselves (one statement: one claimed_at) and
    # by every sample taken; the barrier proved both slots were busy together.
    assert largest_claim(conn) <= 2 and most_held <= 2
    assert inside["most"] == 2


def test_prefetch_must_be_auto_or_an_integer_from_0_to_1000() -> None:
    for bad in (-1, 1001, 1.5, True, None, "always"):
        with pytest.raises(ValueError, match="prefetch"):
            Worker(["default"], prefetch=bad)  # type: ignore[arg-type]


def test_queues_and_concurrency_given_to_run_replace_the_constructors(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=1)
    release = threading.Event()

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        release.wait(DEADLINE)

    conn.execute("SELECT pgq.enqueue_many('default', 'hold', array_fill('{}'::jsonb, array[2]))")
    conn.execute("SELECT pgq.enqueue_many('reports', 'hold', array_fill('{}'::jsonb, array[3]))")
    with running(worker, dsn, queues=["reports"], concurrency=3):
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 3,
                 "three jobs running")
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running' AND queue = 'reports'") == 3
        release.set()
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 3, "the reports done")

    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'default' AND attempt = 0") == 2


def test_a_handler_sees_the_shutdown_and_may_finish_early(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()
    started = threading.Event()
    seen: list[tuple[bool, bool]] = []

    @worker.handler("long")
    def long(job: Job, ctx: JobContext) -> str:
        before = ctx.should_stop
        started.set()
        seen.append((before, ctx.shutting_down.wait(DEADLINE)))
        return "stopped early, cleanly"

    job_id = enqueue(conn, "long")
    with running(worker, dsn):
        assert started.wait(DEADLINE)
        worker.stop()
        wait_for(lambda: seen, "the handler to return")

    assert seen == [(False, True)]
    row = job(conn, job_id)
    assert (row["state"], row["result"]) == ("done", "stopped early, cleanly")


# Leases -----------------------------------------------------------------------------------------


def test_a_worker_whose_attempt_was_taken_over_is_told_and_writes_no_completion(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(lease=2.0)  # renewed about every 0.7 s
    told: list[bool] = []

    @worker.handler("slow")
    def slow(job: Job, ctx: JobContext) -> dict[str, str]:
        told.append(ctx.lease_lost.wait(DEADLINE))
        return {"written": "by the stale attempt"}

    job_id = enqueue(conn, "slow")
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["state"] == "running", "the job to be claimed")
        # As if the worker had stalled past its lease: the lease expires and another claimer takes
        # the job (one transaction, so that no renewal slips in between).
        taken = take_over(conn, job_id, "SELECT id, attempt FROM pgq.claim('thief', lease => '1 minute')")
        assert taken == [(job_id, 2)]
        wait_for(lambda: told, "the handler to return")

    assert told == [True]
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["claimed_by"], row["result"]) == ("running", 2, "thief", None)
    notes = [r[0] for r in conn.execute(
        "SELECT note FROM pgq.job_events WHERE job_id = %s AND event = 'rejected' ORDER BY id", (job_id,))]
    assert notes and all(n.startswith("renew from attempt 1 rejected") for n in notes)
    assert "completed" not in [e[0] for e in events(conn, job_id)]
    # The rightful owner is unaffected.
    assert one(conn, "SELECT pgq.complete(%s, 2)", (job_id,)) is True


def completer_on(client: Client) -> tuple[Completer, HeldJobs]:
    """A completer of its own (no worker around it) and the registry it records into."""
    held, flags = HeldJobs(), Flags()
    nudge = ClaimNudge(PollTimer(1.0, 0), threading.Event())  # (nothing claims: nobody waits on it)
    return Completer(OwnerCalls(client, held, flags, "w"), held, flags, nudge), held


def test_completions_queued_together_are_recorded_by_one_complete_many_fenced_per_job(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    # A handler that returns None does not call pgq.complete itself: its completion waits for the
    # completer, which records all those queued since its last call in one pgq.complete_many.
    # Here three are queued by hand, one of them stale (its lease expired and another worker
    # claimed the job), and one flush records them.
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    conn.execute("SELECT pgq.enqueue_many('default', 'k', array_fill('{}'::jsonb, array[3]))")
    client = Client(dsn)
    try:
        completer, held = completer_on(client)
        mine = client.claim("w", ["default"], batch=3)
        assert len(mine) == 3
        assert take_over(conn, mine[2].id, "SELECT id FROM pgq.claim('thief')") == [(mine[2].id,)]
        for j in mine:
            assert completer.add(held.hold(j, JobContext(job=j, client=client, worker_name="w"), 30.0)) is True
        assert completer.queued == 3
        completer.flush()
    finally:
        client.close()

    assert len(held) == 0 and completer.queued == 0
    done = conn.execute("SELECT id, finished_at FROM pgq.jobs WHERE state = 'done' ORDER BY id").fetchall()
    assert [r[0] for r in done] == [mine[0].id, mine[1].id]
    assert done[0][1] == done[1][1]  # one statement: one statement_timestamp()
    assert job(conn, mine[2].id)["claimed_by"] == "thief"
    assert [e[0] for e in events(conn, mine[2].id)] == ["claimed", "lease_expired", "claimed", "rejected"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("completed" in m for m in messages) == 2
    assert sum("complete rejected" in m for m in messages) == 1


def test_a_busy_workers_sweep_recovers_expired_leases_of_other_queues(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(concurrency=1, sweep_interval=0.3)
    release = threading.Event()

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        release.wait(DEADLINE)

    enqueue(conn, "hold")
    orphan = enqueue(conn, "anything", queue="elsewhere")
    assert one(conn, "SELECT count(*) FROM pgq.claim('crashed', array['elsewhere'], lease => '1 second')") == 1
    with running(worker, dsn):
        # The worker's only slot is busy, so it does not claim; only its sweep recovers the orphan.
        wait_for(lambda: job(conn, orphan)["state"] == "pending", "the sweep to recover the orphan")
        release.set()

    assert job(conn, orphan)["last_event"] == "lease_expired"
    assert job(conn, orphan)["attempt"] == 1


# Wake-up ----------------------------------------------------------------------------------------


def listening_backends(conn: psycopg.Connection) -> int:
    return int(one(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                         " AND query = 'LISTEN pgq'"))


def test_without_listen_an_idle_worker_picks_up_a_job_by_polling(
        dsn: str, conn: psycopg.Connection) -> None:
    """No LISTEN connection exists, so only the worker's polls can find the job. (How long a job
    waits for a poll is measured by the benchmark's "polling only" row, not by a timed test.)"""
    worker = fast_worker(listen=False, poll_interval=0.2)

    @worker.handler("ping")
    def ping(job: Job, ctx: JobContext) -> str:
        return "pong"

    with running(worker, dsn):
        wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgq-worker%'"),
                 "the worker to connect")
        job_id = enqueue(conn, "ping")
        wait_for(finished(conn, job_id), "the job to be done")
        assert listening_backends(conn) == 0

    assert job(conn, job_id)["state"] == "done"


def worker_claim_after(conn: psycopg.Connection, since: Any) -> bool:
    """A backend of the worker has finished a pgq.claim statement that started at ``since`` or
    after (database clock; a claim's claimed_at is its statement's start): that claim has
    answered."""
    return bool(one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgq-worker%%'"
                          " AND state = 'idle' AND query LIKE '%%pgq.claim%%' AND query_start >= %s", (since,)))


def test_a_notify_wakes_an_idle_worker_long_before_its_poll_interval(
        dsn: str, conn: psycopg.Connection) -> None:
    """The worker polls once an hour and never sweeps, and no job of its ends while the probe job
    waits (a finishing job would wake its claim loop): within the test's 30 s, only the NOTIFY,
    which the test sees on its own LISTEN connection, can wake it."""
    worker = fast_worker(poll_interval=3600.0, sweep_interval=0)
    release = threading.Event()

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        release.wait(DEADLINE)

    @worker.handler("ping")
    def ping(job: Job, ctx: JobContext) -> str:
        return "pong"

    with running(worker, dsn), psycopg.connect(dsn, autocommit=True) as listener:
        try:
            wait_for(lambda: listening_backends(conn) == 1, "the worker to LISTEN")
            listener.execute("LISTEN pgq")  # the test's own ear: it sees the NOTIFY pgq sends
            # A job that holds one slot: its claim comes back short (nothing more is due), so the
            # loop then waits for a wake-up; that claim is seen done before the probe job exists.
            holder = enqueue(conn, "hold")
            wait_for(lambda: job(conn, holder)["state"] == "running", "the holding job to start")
            claimed_at = job(conn, holder)["claimed_at"]
            wait_for(lambda: worker_claim_after(conn, claimed_at), "the holding job's claim to answer")
            list(listener.notifies(timeout=0.01))  # drop the holding job's notification
            job_id = enqueue(conn, "ping")
            seen = list(listener.notifies(timeout=10, stop_after=1))
            assert [(n.channel, n.payload) for n in seen] == [("pgq", "default")]
            wait_for(finished(conn, job_id), "the job to be done")
            assert job(conn, holder)["state"] == "running", "no job of the worker ended meanwhile"
        finally:
            release.set()

    assert job(conn, job_id)["state"] == "done"


# Connection loss --------------------------------------------------------------------------------


def terminate_worker_connections(conn: psycopg.Connection) -> int:
    return len(conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE 'pgq-%'"
    ).fetchall())


def test_a_worker_survives_its_connections_being_killed_and_completes_every_job_once(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    worker = fast_worker(concurrency=4, lease=2.0, poll_interval=0.2)

    @worker.handler("work")
    def work(job: Job, ctx: JobContext) -> dict[str, int] | None:
        time.sleep(0.05)  # long enough that kills land while jobs are running
        # Half the jobs return a result (pgq.complete each), half None (batched complete_many).
        return {"n": job.payload["n"]} if job.payload["n"] % 2 else None

    killed = []
    with running(worker, dsn), Client(dsn) as producer:
        for batch in range(12):
            producer.enqueue_many("default", "work", [{"n": batch * 10 + i} for i in range(10)])
            time.sleep(0.1)
            if batch in (3, 8):
                killed.append(terminate_worker_connections(conn))
        wait_for(lambda: state_counts(conn) == {"done": 120}, "all 120 jobs done", timeout=45)
        wait_for(lambda: listening_backends(conn) == 1, "the worker to LISTEN again")

    assert len(killed) == 2 and all(k >= 2 for k in killed), killed  # the pool's and the LISTEN's
    assert any(r.levelno == logging.WARNING for r in caplog.records), "the worker never noticed"
    twice = conn.execute("SELECT job_id FROM pgq.job_events WHERE event = 'completed'"
                         " GROUP BY job_id HAVING count(*) > 1").fetchall()
    assert twice == []
    assert one(conn, "SELECT count(*) FROM pgq.jobs"
                     " WHERE result = jsonb_build_object('n', (payload->>'n')::int)") == 60
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE result IS NULL AND (payload->>'n')::int % 2 = 0") == 60


def test_a_completion_that_hits_a_dead_connection_is_repeated_until_it_answers(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    worker = fast_worker(concurrency=1)
    killer = psycopg.connect(dsn, autocommit=True)

    @worker.handler("work")
    def work(job: Job, ctx: JobContext) -> str:
        # Every connection of the worker dies while the handler runs: the completion that follows
        # finds a dead connection first.
        assert terminate_worker_connections(killer) >= 1
        return "finished"

    try:
        job_id = enqueue(conn, "work")
        with running(worker, dsn):
            wait_for(finished(conn, job_id), "the job to be done")
    finally:
        killer.close()

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["result"]) == ("done", 1, "finished")
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "completed"]
    assert any("complete did not reach the server" in r.getMessage() for r in caplog.records)


def test_a_completion_batch_that_meets_a_dead_connection_stays_queued_and_is_repeated(
        dsn: str, conn: psycopg.Connection) -> None:
    # The completer's side of a connection loss, step by step (in a running worker the claim loop
    # may replace the dead connections first, so the end-to-end test above cannot force it).
    enqueue(conn, "k")
    client = Client(dsn, min_size=1, max_size=1)
    try:
        completer, held = completer_on(client)
        [mine] = client.claim("w", ["default"], batch=1)
        assert completer.add(held.hold(mine, JobContext(job=mine, client=client, worker_name="w"), 30.0)) is True
        killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
                              " current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                              ).fetchall()
        assert len(killed) == 1  # the client's one connection

        with pytest.raises(PgqError) as lost:
            completer.flush()
        assert transient(lost.value)
        assert completer.queued == 1 and len(held) == 1  # kept for the next try
        assert job(conn, mine.id)["state"] == "running"

        completer.flush()  # the pool has replaced the connection: same pair, answered
    finally:
        client.close()
    assert completer.queued == 0 and len(held) == 0
    row = job(conn, mine.id)
    assert (row["state"], row["attempt"]) == ("done", 1)
    assert [e[0] for e in events(conn, mine.id)] == ["claimed", "completed"]


@pytest.mark.slow
def test_a_worker_whose_database_is_unreachable_keeps_trying_and_still_stops_cleanly(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = fast_worker()
    worker.handler("noop")(lambda job, ctx: None)  # a worker without handlers claims nothing at all
    with running(worker, f"postgresql://nobody@127.0.0.1:{port}/nothing?connect_timeout=1"):
        # It keeps trying: a second failed claim, after its backoff (run() neither raised nor
        # returned meanwhile: checked on exit).
        wait_for(lambda: sum("claim failed" in r.getMessage() for r in caplog.records) >= 2, "two failed claims")


# A call that cannot proceed (TESTING.md item 40) ---------------------------------------------------


class Attempts:
    """What the handlers of every worker in the test did: each run's (start, end) per job, on one
    monotonic clock, and when (wall clock) a handler was told to stop."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[int, list[tuple[float, float]]] = {}
        self.told: dict[int, float] = {}

    def ran(self, job_id: int, start: float) -> None:
        with self.lock:
            self.runs.setdefault(job_id, []).append((start, time.monotonic()))

    def overlapping(self) -> list[int]:
        """The jobs two of whose runs overlap."""
        with self.lock:
            return [job_id for job_id, runs in self.runs.items()
                    if any(a[1] > b[0] for a, b in zip(sorted(runs), sorted(runs)[1:]))]


def test_a_job_whose_row_another_transaction_holds_never_runs_twice_at_once_and_the_others_keep_their_leases(
        dsn: str, conn: psycopg.Connection) -> None:
    """A superuser's SELECT ... FOR UPDATE on one running job's row, left open: the worker's
    renewals of that job wait out their bounds (lock_timeout) instead of hanging, its other jobs
    keep their leases, the blocked job's handler is told to stop (ctx.should_stop) before its lease
    ends, and another worker that takes the job over after its lease never runs it beside the
    first one (issue 37: a hung call cannot make a job run twice)."""
    lease = 3.0
    attempts, finish = Attempts(), threading.Event()
    worker = fast_worker(concurrency=3, lease=lease)

    @worker.handler("hold")
    def hold(job: Job, ctx: JobContext) -> None:
        start = time.monotonic()
        while not ctx.should_stop and not finish.is_set():
            ctx.lease_lost.wait(0.01)
        if ctx.should_stop and not finish.is_set():
            attempts.told[job.id] = time.time()
        attempts.ran(job.id, start)

    other = Worker(["default"], concurrency=3, poll_interval=0.1, sweep_interval=0.5, name="other")

    @other.handler("hold")
    def take_over(job: Job, ctx: JobContext) -> None:
        attempts.ran(job.id, time.monotonic())

    blocked, *others = [enqueue(conn, "hold") for _ in range(3)]
    with running(worker, dsn):
        wait_for(lambda: state_counts(conn) == {"running": 3}, "the three jobs to run")
        with psycopg.connect(dsn) as squatter:
            squatter.execute("SELECT 1 FROM pgq.jobs WHERE id = %s FOR UPDATE", (blocked,))
            lease_end = job(conn, blocked)["lease_until"]  # no renewal of it can commit from now on
            with running(other, dsn):
                wait_for(lambda: blocked in attempts.told, "the blocked job's handler to be told to stop",
                         timeout=4 * lease)
                assert attempts.told[blocked] < lease_end.timestamp()  # before its lease could pass on
                for job_id in others:  # renewed past the blocked one's end, still the first attempt
                    wait_for(lambda j=job_id: job(conn, j)["lease_until"] > lease_end + timedelta(seconds=1),
                             "the other jobs' renewals", timeout=4 * lease)
                    assert (job(conn, job_id)["attempt"], job(conn, job_id)["state"]) == (1, "running")
                squatter.rollback()
                finish.set()
                wait_for(lambda: state_counts(conn) == {"done": 3}, "every job done", timeout=6 * lease)
    assert attempts.overlapping() == []
    assert job(conn, blocked)["attempt"] == 2 and len(attempts.runs[blocked]) == 2  # taken over once
    assert all(job(conn, j)["attempt"] == 1 and len(attempts.runs[j]) == 1 for j in others)
    assert "lease_expired" not in [e[0] for j in others for e in events(conn, j)]
