"""Durable execution in the worker (issue 39's Python side), on both runtimes against a real
PostgreSQL: ctx.step runs a step's body once whatever happens to the attempts around it (its
writes and its record commit together with transaction=True); ctx.sleep, ctx.wait_for_signal and
ctx.wait_for_jobs park the job (the attempt ends, the slot is free, nothing is recorded for it)
and it runs again from the top when it may go on; ctx.spawn enqueues a child once; a stale
attempt's record is refused and its handler stops.

Each step body writes a row of ``ran`` (job, label): a body that ran twice shows as two rows. The
waits are for conditions (sqlhelpers.wait_for), never fixed sleeps."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgq_thin import (
    AsyncClient,
    AsyncWorker,
    Client,
    Job,
    JobContext,
    JobOutcome,
    Parked,
    SignalTimeout,
    Worker,
)

from sqlhelpers import events, job, one, steal, wait_for
from workerkit import DEADLINE, enqueue, running

RUNTIMES = {"threads": Worker, "asyncio": AsyncWorker}
RAN = "INSERT INTO ran (job_id, label) VALUES (%s, %s)"


@pytest.fixture(autouse=True)
def tables(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE ran (job_id bigint NOT NULL, label text NOT NULL)")
    conn.execute("GRANT ALL ON ran TO PUBLIC")
    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '10 milliseconds',"
                 " backoff_cap => '10 milliseconds')")


def ran(conn: psycopg.Connection, job_id: int) -> list[str]:
    return [r[0] for r in conn.execute("SELECT label FROM ran WHERE job_id = %s ORDER BY label", (job_id,))]


def step_names(conn: psycopg.Connection, job_id: int) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM pgq.job_steps(%s)", (job_id,))]


def ended(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    row = job(conn, job_id)
    return row if row["state"] in ("done", "failed", "cancelled") else None


class Scene:
    """What the handlers do, by kind and payload, and what they saw: ``runs`` (job id, attempt,
    how the run ended: "returned", or the name of what it raised)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.body_conn = psycopg.connect(dsn, autocommit=True)  # the step bodies' outside writes
        self.thief = psycopg.connect(dsn, autocommit=True)      # takes a job from its attempt
        self.runs: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()
        self.lost: list[bool] = []

    def close(self) -> None:
        self.body_conn.close()
        self.thief.close()

    def body(self, job: Job, label: str) -> dict[str, Any]:
        """A plain step's body: its outside write, then its result."""
        with self.lock:
            self.body_conn.execute(RAN, (job.id, label))
            if job.payload.get("steal_in") == label:
                steal(self.thief, job.id, job.kind)
        return {"label": label, "attempt": job.attempt}

    def before_tx(self, job: Job, label: str) -> None:
        if job.payload.get("steal_in") == label:
            with self.lock:
                steal(self.thief, job.id, job.kind)
        if job.payload.get("raise_in") == [label, job.attempt]:
            raise ValueError(f"step {label} failed after its write")

    def signal(self, job: Job, name: str, payload: dict[str, Any]) -> int:
        with Client(self.dsn) as client:
            return client.signal(job.queue, name, payload)

    def ran(self, job: Job, ctx: JobContext, how: str) -> None:
        self.runs.append((job.id, job.attempt, how))
        self.lost.append(ctx.lease_lost.is_set())

    def runs_of(self, job_id: int) -> list[tuple[int, str]]:
        return [(attempt, how) for j, attempt, how in self.runs if j == job_id]


def outcome_of(outcomes: dict[int, JobOutcome]) -> dict[str, Any]:
    return {"states": sorted({o.state for o in outcomes.values() if o.state}),
            "sum": sum(o.result["n"] for o in outcomes.values())}


def sync_worker(scene: Scene, **settings: Any) -> Worker:
    worker = Worker(["default"], **{**DEFAULTS, **settings})

    def tx_body(conn: psycopg.Connection, job: Job, label: str) -> dict[str, Any]:
        conn.execute(RAN, (job.id, label))
        scene.before_tx(job, label)
        return {"label": label, "tx": True}

    def steps(job: Job, ctx: JobContext) -> Any:
        a = ctx.step("a", scene.body, job, "a")
        b = ctx.step("b", tx_body, job, "b", transaction=True)
        loop = [ctx.step("loop", scene.body, job, f"loop{i}") for i in range(2)]  # loop, loop#2
        if job.attempt in job.payload.get("crash_on", []):
            raise RuntimeError("crashed between two steps")
        c = ctx.step("c", scene.body, job, "c")
        return {"a": a, "b": b, "loop": loop, "c": c}

    def sleeper(job: Job, ctx: JobContext) -> Any:
        ctx.step("before", scene.body, job, "before")
        ctx.sleep(job.payload["delay"], name="nap")
        ctx.step("after", scene.body, job, "after")
        return {"slept": True}

    def waiter(job: Job, ctx: JobContext) -> Any:
        ctx.step("before", scene.body, job, "before")
        if job.payload.get("signal_first"):  # the signal commits while this attempt runs, before its wait
            ctx.step("send", scene.signal, job, job.payload["signal"], {"from": "the handler"})
        try:
            payload = ctx.wait_for_signal(job.payload["signal"], job.payload.get("timeout"))
        except SignalTimeout as exc:
            return {"timed_out": isinstance(exc, TimeoutError), "name": exc.name}
        return {"got": payload}

    def parent(job: Job, ctx: JobContext) -> Any:
        ids = [ctx.spawn("child", "default", "child", {"n": n}) for n in range(1, 4)]
        return {"ids": ids, **outcome_of(ctx.wait_for_jobs(ids))}

    def child(job: Job, ctx: JobContext) -> Any:
        return {"n": job.payload["n"]}

    def plain(job: Job, ctx: JobContext) -> Any:
        return {"plain": True}

    def swallower(job: Job, ctx: JobContext) -> Any:
        try:
            got = ctx.wait_for_signal("go")
        except BaseException as exc:  # noqa: BLE001 - what a careless handler does
            got = {"swallowed": type(exc).__name__, "parked": ctx.parked}
            if job.payload.get("then") == "raise":
                raise RuntimeError("raised after the park") from None
        return {"got": got}

    for kind, function in {"steps": steps, "sleeper": sleeper, "waiter": waiter, "parent": parent,
                           "child": child, "plain": plain, "swallower": swallower}.items():
        worker.handler(kind)(observed(scene, function))
    return worker


def async_worker(scene: Scene, **settings: Any) -> AsyncWorker:
    worker = AsyncWorker(["default"], **{**DEFAULTS, **settings})

    async def tx_body(conn: psycopg.AsyncConnection, job: Job, label: str) -> dict[str, Any]:
        await conn.execute(RAN, (job.id, label))
        scene.before_tx(job, label)
        return {"label": label, "tx": True}

    async def signal(job: Job, name: str, payload: dict[str, Any]) -> int:
        async with AsyncClient(scene.dsn) as client:
            return await client.signal(job.queue, name, payload)

    async def steps(job: Job, ctx: JobContext) -> Any:
        a = await ctx.step("a", scene.body, job, "a")
        b = await ctx.step("b", tx_body, job, "b", transaction=True)
        loop = [await ctx.step("loop", scene.body, job, f"loop{i}") for i in range(2)]
        if job.attempt in job.payload.get("crash_on", []):
            raise RuntimeError("crashed between two steps")
        c = await ctx.step("c", scene.body, job, "c")
        return {"a": a, "b": b, "loop": loop, "c": c}

    async def sleeper(job: Job, ctx: JobContext) -> Any:
        await ctx.step("before", scene.body, job, "before")
        await ctx.sleep(job.payload["delay"], name="nap")
        await ctx.step("after", scene.body, job, "after")
        return {"slept": True}

    async def waiter(job: Job, ctx: JobContext) -> Any:
        await ctx.step("before", scene.body, job, "before")
        if job.payload.get("signal_first"):
            await ctx.step("send", signal, job, job.payload["signal"], {"from": "the handler"})
        try:
            payload = await ctx.wait_for_signal(job.payload["signal"], job.payload.get("timeout"))
        except SignalTimeout as exc:
            return {"timed_out": isinstance(exc, TimeoutError), "name": exc.name}
        return {"got": payload}

    async def parent(job: Job, ctx: JobContext) -> Any:
        ids = [await ctx.spawn("child", "default", "child", {"n": n}) for n in range(1, 4)]
        return {"ids": ids, **outcome_of(await ctx.wait_for_jobs(ids))}

    async def child(job: Job, ctx: JobContext) -> Any:
        return {"n": job.payload["n"]}

    async def plain(job: Job, ctx: JobContext) -> Any:
        return {"plain": True}

    async def swallower(job: Job, ctx: JobContext) -> Any:
        try:
            got = await ctx.wait_for_signal("go")
        except BaseException as exc:  # noqa: BLE001 - what a careless handler does
            got = {"swallowed": type(exc).__name__, "parked": ctx.parked}
            if job.payload.get("then") == "raise":
                raise RuntimeError("raised after the park") from None
        return {"got": got}

    for kind, function in {"steps": steps, "sleeper": sleeper, "waiter": waiter, "parent": parent,
                           "child": child, "plain": plain, "swallower": swallower}.items():
        worker.handler(kind)(observed_async(scene, function))
    return worker


DEFAULTS: dict[str, Any] = {"concurrency": 2, "poll_interval": 0.1, "sweep_interval": 1.0, "shutdown_timeout": 10.0}


def observed(scene: Scene, function: Any) -> Any:
    def handler(job: Job, ctx: JobContext) -> Any:
        try:
            result = function(job, ctx)
        except BaseException as exc:
            scene.ran(job, ctx, type(exc).__name__)
            raise
        scene.ran(job, ctx, "returned")
        return result
    return handler


def observed_async(scene: Scene, function: Any) -> Any:
    async def handler(job: Job, ctx: JobContext) -> Any:
        try:
            result = await function(job, ctx)
        except BaseException as exc:
            scene.ran(job, ctx, type(exc).__name__)
            raise
        scene.ran(job, ctx, "returned")
        return result
    return handler


@pytest.fixture
def scene(dsn: str) -> Iterator[Scene]:
    made = Scene(dsn)
    try:
        yield made
    finally:
        made.close()


def worker_of(runtime: str, scene: Scene, **settings: Any) -> Worker | AsyncWorker:
    return sync_worker(scene, **settings) if runtime == "threads" else async_worker(scene, **settings)


def start(conn: psycopg.Connection, kind: str, **payload: Any) -> int:
    return enqueue(conn, kind, json.dumps(payload))


# Steps ----------------------------------------------------------------------------------------------


def test_each_step_runs_once_across_a_failed_attempt_and_the_retry_reads_them(
        runtime: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    # Attempt 1 runs a, b (in its transaction), loop and loop#2, then crashes; attempt 2 reads the
    # four back without running them and runs c: every body ran once.
    job_id = start(conn, "steps", crash_on=[1])
    with running(worker_of(runtime, scene), dsn):
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    assert done["state"] == "done" and done["attempt"] == 2
    assert ran(conn, job_id) == ["a", "b", "c", "loop0", "loop1"]
    assert scene.runs_of(job_id) == [(1, "RuntimeError"), (2, "returned")]
    assert step_names(conn, job_id) == ["a", "b", "c", "loop", "loop#2"]
    assert done["result"] == {"a": {"label": "a", "attempt": 1}, "b": {"label": "b", "tx": True},
                              "loop": [{"label": "loop0", "attempt": 1}, {"label": "loop1", "attempt": 1}],
                              "c": {"label": "c", "attempt": 2}}
    # The transactional step's write and its record were committed by one transaction.
    assert one(conn, "SELECT (SELECT xmin::text FROM ran WHERE job_id = %(id)s AND label = 'b')"
                     " = (SELECT xmin::text FROM pgq.steps WHERE job_id = %(id)s AND name = 'b')",
               {"id": job_id})


def test_a_transactional_step_that_fails_leaves_neither_its_write_nor_its_record(
        runtime: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    # Attempt 1's step b writes, then raises inside its transaction: the write and the record roll
    # back together, the attempt fails; attempt 2 runs b again, once, and commits both.
    job_id = start(conn, "steps", raise_in=["b", 1])
    with running(worker_of(runtime, scene), dsn):
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    assert done["state"] == "done" and done["attempt"] == 2
    assert ran(conn, job_id) == ["a", "b", "c", "loop0", "loop1"]  # b's row of attempt 1 rolled back
    assert scene.runs_of(job_id) == [(1, "ValueError"), (2, "returned")]
    attempts = dict(conn.execute("SELECT name, attempt FROM pgq.job_steps(%s)", (job_id,)).fetchall())
    assert attempts == {"a": 1, "b": 2, "c": 2, "loop": 2, "loop#2": 2}


@pytest.mark.parametrize("label", ["a", "b"])
def test_a_stale_attempts_record_is_refused_and_its_handler_stops(
        runtime: str, label: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    # While step a (plain) or b (transactional) runs, another claimer takes the job (its lease
    # passed): the step's record_step is refused, the handler stops there with LeaseLost
    # (lease_lost set), nothing after it runs, and the transactional step's write rolls back.
    job_id = start(conn, "steps", steal_in=label)
    with running(worker_of(runtime, scene, lease=60.0), dsn):
        wait_for(lambda: scene.runs_of(job_id), "the handler to stop", DEADLINE)
        assert wait_for(lambda: job(conn, job_id)["attempt"] == 2 and job(conn, job_id), "the thief's attempt")
    assert scene.runs_of(job_id) == [(1, "LeaseLost")] and scene.lost == [True]
    row = job(conn, job_id)
    assert row["state"] == "running" and row["attempt"] == 2 and row["claimed_by"] == "thief"
    assert ran(conn, job_id) == ["a"]  # a's outside write stands; b's rolled back with its record
    assert step_names(conn, job_id) == ([] if label == "a" else ["a"])
    # The refusal's `rejected` event: kept for the plain step; the transactional step's rolled back
    # with its transaction (its record and its write).
    rejected = ("rejected", 1) in [(e[0], e[1]) for e in events(conn, job_id)]
    assert rejected == (label == "a")


# Sleeps -------------------------------------------------------------------------------------------


def test_a_sleep_parks_the_job_and_it_runs_again_with_its_steps_after_the_delay(
        runtime: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    job_id = start(conn, "sleeper", delay=0.5)
    with running(worker_of(runtime, scene), dsn):
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    assert done["state"] == "done" and done["result"] == {"slept": True}
    assert scene.runs_of(job_id) == [(1, "Parked"), (2, "returned")]
    assert ran(conn, job_id) == ["after", "before"]
    assert step_names(conn, job_id) == ["after", "before", "nap"]
    # Parking used no attempt (max_attempts rose by one), and the worker recorded nothing for
    # attempt 1: no completion, failure or rejection of it.
    assert done["max_attempts"] == job(conn, start(conn, "plain"))["max_attempts"] + 1
    assert [e[0] for e in events(conn, job_id) if e[1] == 1 and e[0] in ("completed", "failed", "rejected")] == []
    second = one(conn, "SELECT claimed_at FROM pgq.jobs WHERE id = %s", (job_id,))
    until = one(conn, "SELECT (result ->> 'until')::timestamptz FROM pgq.job_steps(%s) WHERE name = 'nap'", (job_id,))
    assert second >= until  # the second attempt was claimed at or after the recorded wake time


@pytest.mark.parametrize("wait", ["sleep", "signal"])
def test_a_worker_of_concurrency_one_runs_other_jobs_while_one_sleeps_or_waits(
        runtime: str, wait: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    if wait == "sleep":
        parked = start(conn, "sleeper", delay=3600)
    else:
        parked = start(conn, "waiter", signal="go")
    with running(worker_of(runtime, scene, concurrency=1), dsn):
        wait_for(lambda: scene.runs_of(parked) == [(1, "Parked")], "the first job to park", DEADLINE)
        others = [start(conn, "plain") for _ in range(3)]
        for other in others:
            assert wait_for(lambda other=other: ended(conn, other), "another job to run", DEADLINE)["state"] == "done"
        row = job(conn, parked)
        assert row["state"] == ("pending" if wait == "sleep" else "waiting") and row["lease_until"] is None
        if wait == "signal":
            assert one(conn, "SELECT pgq.signal('default', 'go', '{\"ok\": 1}')") == 1
            done = wait_for(lambda: ended(conn, parked), "the waiting job to end", DEADLINE)
            assert done["result"] == {"got": {"ok": 1}}
            assert scene.runs_of(parked) == [(1, "Parked"), (2, "returned")]


# Signals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "during", "after"])
def test_a_signal_sent_before_during_or_after_the_wait_wakes_it_once(
        runtime: str, when: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    # before: sent before the job ran (it never parks); during: sent by the attempt itself before
    # its wait (committed while it runs); after: sent once the job is parked. Later signals of
    # the name change nothing.
    start(conn, "plain")  # (the queue exists)
    if when == "before":
        with Client(dsn) as client:
            assert client.signal("default", "go", {"from": "before"}) == 0
    job_id = start(conn, "waiter", signal="go", signal_first=when == "during")
    with running(worker_of(runtime, scene), dsn):
        if when == "after":
            wait_for(lambda: job(conn, job_id)["state"] == "waiting", "the job to park", DEADLINE)
            with Client(dsn) as client:
                assert client.signal("default", "go", {"from": "after"}) == 1
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
        with Client(dsn) as client:
            assert client.signal("default", "go", {"from": "late"}) == 0  # the first of a name wins
    expected = {"before": {"from": "before"}, "during": {"from": "the handler"}, "after": {"from": "after"}}[when]
    assert done["state"] == "done" and done["result"] == {"got": expected}
    runs = scene.runs_of(job_id)
    assert runs == ([(1, "Parked"), (2, "returned")] if when == "after" else [(1, "returned")])
    assert ran(conn, job_id) == ["before"]


def test_one_signal_wakes_every_job_waiting_for_it(
        runtime: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    ids = [start(conn, "waiter", signal="all") for _ in range(4)]
    with running(worker_of(runtime, scene), dsn):
        wait_for(lambda: all(job(conn, i)["state"] == "waiting" for i in ids), "every job to park", DEADLINE)
        with Client(dsn) as client:
            assert client.signal("default", "all", {"n": 1}) == 4
        for job_id in ids:
            done = wait_for(lambda job_id=job_id: ended(conn, job_id), "the job to end", DEADLINE)
            assert done["result"] == {"got": {"n": 1}}
    assert [scene.runs_of(i) for i in ids] == [[(1, "Parked"), (2, "returned")]] * 4


def test_a_wait_past_its_timeout_raises_signal_timeout_and_stays_timed_out(
        runtime: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    job_id = start(conn, "waiter", signal="never", timeout=0.2)
    with running(worker_of(runtime, scene), dsn):
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    assert done["state"] == "done" and done["result"] == {"timed_out": True, "name": "never"}
    assert scene.runs_of(job_id) == [(1, "Parked"), (2, "returned")]
    assert issubclass(SignalTimeout, TimeoutError) and not issubclass(Parked, Exception)


# Children ------------------------------------------------------------------------------------------


def test_a_parent_spawns_children_once_and_waits_for_them_without_a_slot(
        runtime: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    # concurrency 1: the parent's slot is free while it waits, so its children run on it.
    job_id = start(conn, "parent")
    with running(worker_of(runtime, scene, concurrency=1), dsn):
        done = wait_for(lambda: ended(conn, job_id), "the parent to end", DEADLINE)
    children = conn.execute("SELECT id, state::text, workflow_id, parent_id FROM pgq.jobs WHERE kind = 'child'"
                            " ORDER BY id").fetchall()
    assert [(c[1], c[2], c[3]) for c in children] == [("done", job_id, job_id)] * 3  # spawned once each
    assert done["state"] == "done"
    assert done["result"] == {"ids": [c[0] for c in children], "states": ["done"], "sum": 6}
    assert scene.runs_of(job_id) == [(1, "Parked"), (2, "returned")]
    assert step_names(conn, job_id) == ["child", "child#2", "child#3"]


@pytest.mark.parametrize("then", ["return", "raise"])
def test_a_handler_that_swallows_parked_changes_nothing(
        runtime: str, then: str, scene: Scene, dsn: str, conn: psycopg.Connection) -> None:
    # The park ended the attempt in the database: what the handler returns or raises after catching
    # Parked is not recorded (no completion, no failure, no rejected call); the job stays parked
    # and runs again when the signal comes.
    job_id = start(conn, "swallower", then=then)
    with running(worker_of(runtime, scene), dsn):
        wait_for(lambda: scene.runs_of(job_id), "the first run to end", DEADLINE)
        assert job(conn, job_id)["state"] == "waiting"
        with Client(dsn) as client:
            assert client.signal("default", "go", {"n": 2}) == 1
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    assert done["state"] == "done" and done["result"] == {"got": {"n": 2}}
    assert scene.runs_of(job_id) == [(1, "returned" if then == "return" else "RuntimeError"), (2, "returned")]
    assert [e[0] for e in events(conn, job_id) if e[1] == 1 and e[0] in ("completed", "failed", "rejected")] == []


def test_misuse_is_refused_clearly(runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    # A Worker cannot await a step's coroutine; a name that is not a str; a sleep of a bad delay
    # (the server's 22023: the job is still ours, and the handler goes on to complete it).
    seen: list[str] = []
    worker = RUNTIMES[runtime](["default"], **DEFAULTS)

    async def coroutine() -> int:
        return 1

    if runtime == "threads":
        @worker.handler("misuse")
        def misuse(job: Job, ctx: JobContext) -> Any:
            for attempt in (lambda: ctx.step("s", coroutine), lambda: ctx.step(7, dict),
                            lambda: ctx.sleep(-1)):
                try:
                    attempt()
                except Exception as exc:  # noqa: BLE001 - recorded for the test
                    seen.append(f"{type(exc).__name__}: {exc}")
            return {"ok": ctx.step("s", dict, a=1)}
    else:
        @worker.handler("misuse")
        async def amisuse(job: Job, ctx: JobContext) -> Any:
            for attempt in (lambda: ctx.step(7, dict), lambda: ctx.sleep(-1)):
                try:
                    await attempt()
                except Exception as exc:  # noqa: BLE001
                    seen.append(f"{type(exc).__name__}: {exc}")
            return {"ok": await ctx.step("s", coroutine)}
    job_id = start(conn, "misuse")
    with running(worker, dsn):
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    if runtime == "threads":
        assert seen[0].startswith("TypeError: step 's': its function returned an awaitable")
        seen = seen[1:]
        assert done["result"] == {"ok": {"a": 1}}
    else:
        assert done["result"] == {"ok": 1}  # an async def step is awaited
    assert seen[0] == "TypeError: a step's name must be a str, got int"
    assert seen[1].startswith("InvalidArgument: ") and '"delay"' in seen[1]  # the server's 22023, job still ours


def test_a_plain_handler_on_an_async_worker_is_told_to_be_async(dsn: str, conn: psycopg.Connection) -> None:
    # Its thread cannot await the calls: each raises TypeError at once (no coroutine left unawaited,
    # no step silently skipped), and the attempt fails with it.
    seen: list[str] = []
    worker = AsyncWorker(["default"], **DEFAULTS)

    @worker.handler("plain_durable")
    def plain_durable(job: Job, ctx: JobContext) -> Any:
        for call in (lambda: ctx.step("s", dict), lambda: ctx.sleep(1), lambda: ctx.wait_for_signal("go"),
                     lambda: ctx.spawn("c", "default", "k"), lambda: ctx.wait_for_jobs([1])):
            try:
                call()
            except TypeError as exc:
                seen.append(str(exc))
        return {"seen": len(seen)}

    job_id = start(conn, "plain_durable")
    with running(worker, dsn):
        done = wait_for(lambda: ended(conn, job_id), "the job to end", DEADLINE)
    assert done["result"] == {"seen": 5} and done["state"] == "done"
    assert seen[0].startswith("ctx.step() on an AsyncWorker is awaited in an async def handler")
    assert step_names(conn, job_id) == []
