"""ctx.transaction(): the handler's own writes and the job's completion in one transaction, on
both runtimes (a plain handler with ``with`` on a Worker, an ``async def`` one with ``async with``
on an AsyncWorker), against a real PostgreSQL.

The handler here writes one row of ``effects`` (job id, attempt) in its block. Whatever happens
(an exception, a stalled owner whose job another attempt took, a kill -9 of the worker process at
each step) the effect lands at most once, and exactly when the job is done: by the attempt that
completed it, in the very transaction that completed it (the rows share their xmin).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgq_thin import AsyncWorker, Client, Job, JobContext, LeaseLost, Retry, Worker, WrongState
from pgq_thin.errors import BadArgument
from pgq_thin.testing.server import ThrowawayPostgres
from pgq_thin.testing.topology import PgBouncer, pgbouncer_program
from pgq_thin.worker.held import HeldJobs

from sqlhelpers import LOWER_LEASE_FLOOR, events, expire_lease, job, one, take_over, wait_for
from workerkit import DEADLINE, enqueue, running
from workerprocess import ROOT, WorkerProcess, spawner

RUNTIMES = {"threads": Worker, "asyncio": AsyncWorker}
INSERT = "INSERT INTO effects (job_id, attempt) VALUES (%s, %s)"


@pytest.fixture(autouse=True)
def effects(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE effects (job_id bigint NOT NULL, attempt integer NOT NULL)")
    conn.execute("GRANT ALL ON effects TO PUBLIC")


def effect_rows(conn: psycopg.Connection, job_id: int) -> list[tuple[int, int]]:
    return conn.execute("SELECT job_id, attempt FROM effects WHERE job_id = %s ORDER BY attempt",
                        (job_id,)).fetchall()


def same_transaction(conn: psycopg.Connection, job_id: int) -> bool:
    """Whether the effect row and the job's completion were written by one transaction."""
    return bool(one(conn, "SELECT (SELECT xmin::text FROM effects WHERE job_id = %s)"
                          " = (SELECT xmin::text FROM pgq.jobs WHERE id = %s)", (job_id, job_id)))


def completions(conn: psycopg.Connection, job_id: int) -> list[int]:
    """The attempts whose completion pgq.job_events recorded."""
    return [e[1] for e in events(conn, job_id) if e[0] == "completed"]


class Scene:
    """What the handlers below do, by the job's payload, and what they saw.

    ``raise_on``: that attempt raises ValueError in the block, after writing. ``stall_on``: that
    attempt, after writing, sets ``wrote`` and waits in the block for ``release`` (or, with
    ``until_lost``, for ctx.lease_lost). ``after``: after a committed block the handler returns
    ``"value"`` or raises (``"raise"``, ``"retry"``). ``result_in_block``: the result is set on
    the transaction object inside the block instead of given to ctx.transaction(). ``seen``:
    (attempt, what the block ended with, ctx.completed, ctx.lease_lost) for each run."""

    def __init__(self) -> None:
        self.wrote = threading.Event()
        self.release = threading.Event()
        self.seen: list[tuple[int, str, bool, bool]] = []

    def must_stall(self, job: Job) -> bool:
        return bool(job.payload.get("stall_on") == job.attempt)

    def stall(self, job: Job, ctx: JobContext) -> bool:
        """Whether the stall is over (the test released it, or the lease is lost)."""
        return (ctx.lease_lost.is_set() if job.payload.get("until_lost") else self.release.is_set())

    def inside(self, job: Job) -> None:
        if job.payload.get("raise_on") == job.attempt:
            raise ValueError(f"attempt {job.attempt} failed in its block")

    def ended(self, job: Job, ctx: JobContext, how: str) -> None:
        self.seen.append((job.attempt, how, ctx.completed, ctx.lease_lost.is_set()))

    def after(self, job: Job) -> Any:
        after = job.payload.get("after")
        if after == "raise":
            raise RuntimeError("raised after the commit")
        if after == "retry":
            raise Retry(delay=0.01)
        return {"returned": "after the commit"} if after == "value" else None


def transactional(runtime: str, scene: Scene, **settings: Any) -> Worker | AsyncWorker:
    """A worker of ``runtime`` whose handler for ``effect`` writes the effect in ctx.transaction()."""
    defaults: dict[str, Any] = {"concurrency": 2, "poll_interval": 0.1, "sweep_interval": 1.0,
                                "shutdown_timeout": 10.0}
    worker = RUNTIMES[runtime](["default"], **{**defaults, **settings})
    if isinstance(worker, AsyncWorker):
        @worker.handler("effect")
        async def async_effect(job: Job, ctx: JobContext) -> Any:
            in_block = bool(job.payload.get("result_in_block"))
            transaction = ctx.transaction(result=None if in_block else {"attempt": job.attempt})
            try:
                async with transaction as conn:
                    await conn.execute(INSERT, (job.id, job.attempt))
                    if scene.must_stall(job):
                        scene.wrote.set()
                        while not scene.stall(job, ctx):
                            await asyncio.sleep(0.01)
                    scene.inside(job)
                    if in_block:
                        transaction.result = {"attempt": job.attempt, "set": "in the block"}
            except BaseException as exc:
                scene.ended(job, ctx, type(exc).__name__)
                raise
            scene.ended(job, ctx, "committed")
            return scene.after(job)
    else:
        @worker.handler("effect")
        def effect(job: Job, ctx: JobContext) -> Any:
            in_block = bool(job.payload.get("result_in_block"))
            transaction = ctx.transaction(result=None if in_block else {"attempt": job.attempt})
            try:
                with transaction as conn:
                    conn.execute(INSERT, (job.id, job.attempt))
                    if scene.must_stall(job):
                        scene.wrote.set()
                        while not scene.stall(job, ctx):
                            threading.Event().wait(0.01)
                    scene.inside(job)
                    if in_block:
                        transaction.result = {"attempt": job.attempt, "set": "in the block"}
            except BaseException as exc:
                scene.ended(job, ctx, type(exc).__name__)
                raise
            scene.ended(job, ctx, "committed")
            return scene.after(job)
    return worker


def effect_job(conn: psycopg.Connection, **payload: Any) -> int:
    return enqueue(conn, "effect", json.dumps(payload))


# Committing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("after", [None, "value", "raise", "retry"])
def test_the_effect_and_the_completion_commit_together_and_the_worker_records_nothing_more(
        runtime: str, after: str | None, dsn: str, conn: psycopg.Connection) -> None:
    # Whatever the handler does after its committed block (returns nothing, returns a value,
    # raises, asks for a retry), the job stays done with the transaction's result, completed once.
    scene = Scene()
    job_id = effect_job(conn, after=after)
    with running(transactional(runtime, scene), dsn):
        wait_for(lambda: scene.seen and job(conn, job_id)["state"] == "done", "the job to be done")
        wait_for(lambda: one(conn, "SELECT count(*) = 0 FROM pgq.jobs WHERE state = 'running'"), "nothing running")

    assert scene.seen == [(1, "committed", True, False)]
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["result"]) == ("done", 1, {"attempt": 1})
    assert effect_rows(conn, job_id) == [(job_id, 1)]
    assert same_transaction(conn, job_id)
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "completed"]  # no second call, no rejection


def test_the_result_may_be_set_inside_the_block_and_a_follow_up_enqueued_with_the_effect(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    worker = RUNTIMES[runtime](["default"], concurrency=1, poll_interval=0.1)
    follow_ups: list[int] = []
    if isinstance(worker, AsyncWorker):
        @worker.handler("order")
        async def async_order(job: Job, ctx: JobContext) -> None:
            transaction = ctx.transaction()
            async with transaction as conn:
                await conn.execute(INSERT, (job.id, job.attempt))
                follow_ups.append(await ctx.client.enqueue("mail", "receipt", {"order": job.id}, conn=conn))
                transaction.result = {"receipt": follow_ups[-1]}
    else:
        @worker.handler("order")
        def order(job: Job, ctx: JobContext) -> None:
            transaction = ctx.transaction()
            with transaction as conn:
                conn.execute(INSERT, (job.id, job.attempt))
                follow_ups.append(ctx.client.enqueue("mail", "receipt", {"order": job.id}, conn=conn))
                transaction.result = {"receipt": follow_ups[-1]}

    job_id = enqueue(conn, "order")
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["state"] == "done", "the job to be done")
    (receipt,) = follow_ups
    assert job(conn, job_id)["result"] == {"receipt": receipt}
    assert job(conn, receipt)["state"] == "pending" and job(conn, receipt)["payload"] == {"order": job_id}
    assert one(conn, "SELECT count(DISTINCT xmin::text) FROM (SELECT xmin FROM effects UNION ALL"
                     " SELECT xmin FROM pgq.jobs WHERE id IN (%s, %s)) AS written", (job_id, receipt)) == 1


# Rolling back ---------------------------------------------------------------------------------------


def test_an_exception_in_the_block_rolls_the_effect_back_and_the_job_is_retried(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '10 ms', backoff_cap => '20 ms')")
    scene = Scene()
    job_id = effect_job(conn, raise_on=1)
    with running(transactional(runtime, scene), dsn):
        wait_for(lambda: job(conn, job_id)["state"] == "done", "the retry to complete the job")

    assert scene.seen == [(1, "ValueError", False, False), (2, "committed", True, False)]
    row = job(conn, job_id)
    assert (row["attempt"], row["result"]) == (2, {"attempt": 2})
    assert "ValueError: attempt 1 failed in its block" in row["last_error"]
    assert effect_rows(conn, job_id) == [(job_id, 2)]  # attempt 1's write was rolled back
    assert same_transaction(conn, job_id)
    assert [e[:2] for e in events(conn, job_id)] == [("claimed", 1), ("failed", 1), ("claimed", 2), ("completed", 2)]


@pytest.mark.parametrize("noticed_by", ["pgq.complete", "a refused renewal"])
def test_a_stalled_owners_writes_never_land_and_the_new_owner_completes_the_job_once(
        runtime: str, noticed_by: str, dsn: str, conn: psycopg.Connection) -> None:
    # Attempt 1 writes its effect and stalls in its block; meanwhile its lease expires and the job
    # is claimed again. With a long lease no renewal runs during the test: the stale owner learns
    # it at its block's end, from pgq.complete's answer in its own transaction. With a short one
    # the renewer learns it first (ctx.lease_lost), and the block's end sends nothing. Either way
    # the transaction rolls back and the handler gets LeaseLost.
    scene = Scene()
    by_completion = noticed_by == "pgq.complete"
    worker = transactional(runtime, scene, lease=60.0 if by_completion else 2.0)
    job_id = effect_job(conn, stall_on=1, until_lost=not by_completion)
    with running(worker, dsn):
        assert scene.wrote.wait(DEADLINE)
        # As if the owner had stalled past its lease: another owner takes over.
        if by_completion:  # the worker's own claimer takes the job again: attempt 2 commits its effect
            expire_lease(conn, job_id)

            def retaken() -> bool:  # (its claims may raise the lease floor past the lease moved by hand)
                conn.execute(LOWER_LEASE_FLOOR)
                return bool(job(conn, job_id)["state"] == "done")

            wait_for(retaken, "attempt 2 to complete the job")
            scene.release.set()
        else:
            assert take_over(conn, job_id, "SELECT id FROM pgq.claim('thief', lease => '1 minute')") == [(job_id,)]
        wait_for(lambda: len(scene.seen) == (2 if by_completion else 1), "the stale owner's block to end")
        if not by_completion:  # the new owner completes it, with its effect in the same transaction
            with conn.transaction():
                conn.execute(INSERT, (job_id, 2))
                assert one(conn, "SELECT pgq.complete(%s, 2, '{\"attempt\": 2}')", (job_id,)) is True

    stale = (1, "LeaseLost", False, True)
    assert scene.seen == ([(2, "committed", True, False), stale] if by_completion else [stale])
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["result"]) == ("done", 2, {"attempt": 2})
    assert effect_rows(conn, job_id) == [(job_id, 2)]  # the stale owner's write never landed
    assert same_transaction(conn, job_id)
    assert completions(conn, job_id) == [2]
    assert "failed" not in [e[0] for e in events(conn, job_id)]  # the stale attempt's outcome was discarded


def test_a_job_cancelled_while_its_handler_is_in_the_block_keeps_none_of_its_writes(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    # pgq.cancel against the block's completion: the cancel commits first, so the completion is
    # "not yours" and the block's writes roll back with it (or, where the worker interrupts a
    # cancelled handler at once, they roll back with the interruption). The job stays cancelled.
    scene = Scene()
    job_id = effect_job(conn, stall_on=1)
    with running(transactional(runtime, scene, lease=60.0), dsn):
        assert scene.wrote.wait(DEADLINE)
        assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True
        scene.release.set()
        wait_for(lambda: scene.seen, "the block to end")
    ((attempt, ended, completed, _),) = scene.seen
    assert (attempt, completed) == (1, False) and ended != "committed"
    assert job(conn, job_id)["state"] == "cancelled"
    assert effect_rows(conn, job_id) == []
    assert completions(conn, job_id) == []


def test_a_commit_the_server_refuses_leaves_the_job_to_the_worker_which_fails_it_for_a_retry(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    # A deferred unique constraint fails at COMMIT (after pgq.complete answered true): nothing was
    # committed, for sure, so the job is the worker's again and the error is recorded as the
    # handler's failure; the retry commits.
    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '10 ms', backoff_cap => '20 ms')")
    conn.execute("CREATE TABLE once (job_id bigint UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    worker = RUNTIMES[runtime](["default"], concurrency=1, poll_interval=0.1)
    raised: list[str] = []
    dml = "INSERT INTO once VALUES (%s)"
    if isinstance(worker, AsyncWorker):
        @worker.handler("effect")
        async def async_effect(job: Job, ctx: JobContext) -> None:
            try:
                async with ctx.transaction(result={"attempt": job.attempt}) as conn:
                    await conn.execute(INSERT, (job.id, job.attempt))
                    for _ in range(2 if job.attempt == 1 else 1):
                        await conn.execute(dml, (job.id,))
            except Exception as exc:
                raised.append(type(exc).__name__)
                raise
    else:
        @worker.handler("effect")
        def effect(job: Job, ctx: JobContext) -> None:
            try:
                with ctx.transaction(result={"attempt": job.attempt}) as conn:
                    conn.execute(INSERT, (job.id, job.attempt))
                    for _ in range(2 if job.attempt == 1 else 1):
                        conn.execute(dml, (job.id,))
            except Exception as exc:
                raised.append(type(exc).__name__)
                raise

    job_id = effect_job(conn)
    with running(worker, dsn):
        wait_for(lambda: job(conn, job_id)["state"] == "done", "the retry to complete the job")
    assert raised == ["PgqError"]
    row = job(conn, job_id)
    assert (row["attempt"], row["result"]) == (2, {"attempt": 2})
    assert "duplicate key value violates unique constraint" in row["last_error"]
    assert effect_rows(conn, job_id) == [(job_id, 2)] and same_transaction(conn, job_id)
    assert [e[:2] for e in events(conn, job_id)] == [("claimed", 1), ("failed", 1), ("claimed", 2), ("completed", 2)]


def test_a_completion_waits_for_a_renewal_in_flight(dsn: str, conn: psycopg.Connection) -> None:
    # The registry grants the one settling call: while the renewer is extending the lease, the
    # block's end waits for it, then completes.
    job_id = effect_job(conn)
    with Client(dsn) as client:
        (claimed,) = client.claim("w", ["default"])
        registry = HeldJobs()
        ctx = JobContext(claimed, client, "w")
        entry = registry.hold(claimed, ctx, 30.0)
        assert registry.begin_renewal(entry)
        done = threading.Event()

        def handler() -> None:
            with ctx.transaction(result={"attempt": 1}) as block:
                block.execute(INSERT, (job_id, 1))
            done.set()

        thread = threading.Thread(target=handler, daemon=True)
        thread.start()
        wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                                   " AND query LIKE 'INSERT INTO effects%%'"), "the block to have written")
        assert not done.wait(0.3)  # it waits for the renewal
        assert job(conn, job_id)["state"] == "running"
        registry.end_renewal(entry)
        assert done.wait(DEADLINE)
        thread.join(DEADLINE)
    assert ctx.completed and job(conn, job_id)["state"] == "done"
    assert effect_rows(conn, job_id) == [(job_id, 1)] and same_transaction(conn, job_id)
    assert entry.state == "settled"  # nobody else records this attempt


def test_a_lease_lost_is_a_wrong_state_and_a_transaction_after_it_is_refused_at_once(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    # LeaseLost is the WrongState a handler catches; once the job is no longer ours, a new
    # ctx.transaction() is refused before it borrows a connection or writes anything.
    assert issubclass(LeaseLost, WrongState)
    scene = Scene()
    second: list[str] = []
    worker = RUNTIMES[runtime](["default"], concurrency=1, poll_interval=0.1, lease=2.0)
    if isinstance(worker, AsyncWorker):
        @worker.handler("effect")
        async def async_effect(job: Job, ctx: JobContext) -> None:
            scene.wrote.set()
            while not ctx.lease_lost.is_set():
                await asyncio.sleep(0.01)
            try:
                async with ctx.transaction():
                    second.append("entered")
            except WrongState as exc:
                second.append(type(exc).__name__)
    else:
        @worker.handler("effect")
        def effect(job: Job, ctx: JobContext) -> None:
            scene.wrote.set()
            ctx.lease_lost.wait(DEADLINE)
            try:
                with ctx.transaction():
                    second.append("entered")
            except WrongState as exc:
                second.append(type(exc).__name__)

    job_id = effect_job(conn)
    with running(worker, dsn):
        assert scene.wrote.wait(DEADLINE)
        assert take_over(conn, job_id, "SELECT id FROM pgq.claim('thief', lease => '1 minute')") == [(job_id,)]
        wait_for(lambda: second, "the handler to try")
    assert second == ["LeaseLost"]
    assert effect_rows(conn, job_id) == []


# Misuse ---------------------------------------------------------------------------------------------


def test_misuse_is_refused_clearly(runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    # A result JSON cannot carry: BadArgument before the block. The other runtime's form: a
    # TypeError that says which to use. A second transaction after a committed one: RuntimeError.
    worker = RUNTIMES[runtime](["default"], concurrency=1, poll_interval=0.1)
    told: list[str] = []

    def refused(attempt: Callable[[], Any]) -> None:
        try:
            attempt()
        except (BadArgument, TypeError, RuntimeError) as exc:
            told.append(f"{type(exc).__name__}: {exc}")

    if isinstance(worker, AsyncWorker):
        @worker.handler("effect")
        async def async_effect(job: Job, ctx: JobContext) -> None:
            refused(lambda: ctx.transaction(result=float("nan")))

            def plain_with() -> None:
                with ctx.transaction():
                    pass
            refused(plain_with)
            async with ctx.transaction() as conn:
                await conn.execute(INSERT, (job.id, job.attempt))
            try:
                async with ctx.transaction():
                    pass
            except RuntimeError as exc:
                told.append(f"RuntimeError: {exc}")
    else:
        @worker.handler("effect")
        def effect(job: Job, ctx: JobContext) -> None:
            refused(lambda: ctx.transaction(result=float("nan")))

            async def async_with() -> None:
                async with ctx.transaction():
                    pass
            refused(lambda: asyncio.run(async_with()))
            with ctx.transaction() as conn:
                conn.execute(INSERT, (job.id, job.attempt))
            refused(lambda: ctx.transaction().__enter__())

    job_id = effect_job(conn)
    with running(worker, dsn):
        wait_for(lambda: len(told) == 3, "the handler to try each")
        wait_for(lambda: job(conn, job_id)["state"] == "done", "the job to be done")
    assert told[0].startswith('BadArgument: argument "result"')
    other = "async with ctx.transaction()" if runtime == "asyncio" else "with ctx.transaction()"
    assert told[1].startswith("TypeError: on a") and other in told[1]
    assert told[2] == f"RuntimeError: job {job_id} was completed by an earlier ctx.transaction() of this attempt"
    assert effect_rows(conn, job_id) == [(job_id, 1)] and completions(conn, job_id) == [1]


# The pool --------------------------------------------------------------------------------------------


def test_every_slot_in_a_block_at_once_leaves_the_worker_its_own_connections(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    # Each block holds one of the pool's connections (concurrency + 3) for its length; with every
    # slot in one, the claimer, the renewer and the completer still have theirs: the leases are
    # renewed (several times over) and nothing is lost.
    scene = Scene()
    worker = transactional(runtime, scene, concurrency=3, lease=2.0)
    ids = [effect_job(conn, stall_on=1) for _ in range(3)]
    with running(worker, dsn):
        wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                                   " AND datname = current_database()") == 3, "three blocks open at once")
        for _ in range(3):
            seen = one(conn, "SELECT max(lease_until) FROM pgq.jobs")
            wait_for(lambda seen=seen: one(conn, "SELECT min(lease_until) FROM pgq.jobs") > seen,
                     "every lease to be renewed again while the blocks are open")
        scene.release.set()
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 3, "all three done")
    assert sorted(s[:3] for s in scene.seen) == [(1, "committed", True)] * 3
    assert one(conn, "SELECT count(*) FROM effects") == 3
    assert all(completions(conn, i) == [1] for i in ids)


@pytest.mark.slow
@pytest.mark.skipif(pgbouncer_program() is None, reason="pgbouncer is not installed")
def test_a_handlers_transaction_works_behind_pgbouncer_in_transaction_mode(
        runtime: str, pg_server: ThrowawayPostgres, dsn: str, conn: psycopg.Connection) -> None:
    # One transaction is one server connection for its length, whatever PgBouncer does between
    # transactions: the worker in pooled mode commits effect and completion together.
    scene = Scene()
    ids = [effect_job(conn, after="value") for _ in range(6)]
    with PgBouncer(pg_server.port, pool_mode="transaction", pool_size=3) as bouncer:
        worker = transactional(runtime, scene, pooled=True)
        with running(worker, bouncer.dsn(conninfo_to_dict(dsn)["dbname"])):
            wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 6, "all done")
    assert one(conn, "SELECT count(*) FROM effects") == 6
    assert all(same_transaction(conn, i) and completions(conn, i) == [1] for i in ids)


# kill -9 at each step ----------------------------------------------------------------------------

APPS = {"threads": ROOT / "tests" / "apps" / "transactional.py",
        "asyncio": ROOT / "tests" / "apps" / "transactional_async.py"}


@pytest.fixture
def spawn(runtime: str, dsn: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with spawner(APPS[runtime], dsn, tmp_path) as start:
        yield start


def landed_iff_done(conn: psycopg.Connection, job_id: int) -> bool:
    """The effect is there exactly when the job is done (and then once, with it)."""
    done = job(conn, job_id)["state"] == "done"
    rows = effect_rows(conn, job_id)
    return len(rows) == (1 if done else 0) and (not done or same_transaction(conn, job_id))


@pytest.mark.slow
@pytest.mark.parametrize("step", ["before_write", "after_write", "after_commit"])
def test_a_kill_9_at_each_step_lands_the_effect_at_most_once_and_exactly_when_the_job_is_done(
        step: str, spawn: Callable[..., WorkerProcess], conn: psycopg.Connection) -> None:
    job_id = effect_job(conn, pause=step)
    victim = spawn(TRANSACTIONAL_LEASE="2")
    wait_for(lambda: victim.logged(f"job {job_id} attempt 1 at {step}"), f"the handler to reach {step}")
    victim.process.send_signal(signal.SIGKILL)
    assert victim.process.wait(DEADLINE) == -signal.SIGKILL
    # The killed backend's open transaction (if any) ends when the server notices the client gone.
    wait_for(lambda: one(conn, "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE 'pgq-worker %'"),
             "the victim's sessions to end")
    assert landed_iff_done(conn, job_id)
    assert job(conn, job_id)["state"] == ("done" if step == "after_commit" else "running")

    rescuer = spawn(TRANSACTIONAL_LEASE="30")
    wait_for(lambda: rescuer.logged("started"), "the rescuer to start")
    wait_for(lambda: job(conn, job_id)["state"] == "done", "the job to be done")
    assert rescuer.stop() == 0
    assert landed_iff_done(conn, job_id)
    attempt = 1 if step == "after_commit" else 2
    assert effect_rows(conn, job_id) == [(job_id, attempt)]
    assert job(conn, job_id)["result"] == {"attempt": attempt}
    assert completions(conn, job_id) == [attempt]
