"""Middleware and lifecycle hooks (issue 27), on both runtimes, against the real database.

``worker.middleware(fn)``: ``fn(job, ctx, call_next)`` wraps every handler, the first registered
outermost; what it returns is the result, what it raises the job's outcome. ``worker.on_start(fn)``
and ``worker.on_stop(fn)`` run once per run. On an AsyncWorker each part may be an ``async def``
(run in the slot's task) or plain (run in a handler thread); the "asyncio mixed" flavour chains
both kinds, so that the chain passes between the loop and the threads both ways.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgq_thin import Job
from pgq_thin.testing import adrain, drain
from pgq_thin.worker import AsyncWorker, JobContext, Retry, Worker
from pgq_thin.worker.middleware import chained

from sqlhelpers import job, one, wait_for
from workerkit import DEADLINE, enqueue, finished, running

FLAVOURS = ("threads", "asyncio", "asyncio mixed", "asyncio mixed, async outermost")


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def new_worker(flavour: str, **settings: Any) -> Worker | AsyncWorker:
    kind = Worker if flavour == "threads" else AsyncWorker
    defaults: dict[str, Any] = {"concurrency": 2, "poll_interval": 0.1, "sweep_interval": 1.0, "shutdown_timeout": 10.0}
    return kind(["default"], **{**defaults, **settings})


def as_async(flavour: str, position: int) -> bool:
    """Whether the part at ``position`` of the chain (0: the outermost middleware, 1: the next; -1:
    the handler) is an ``async def`` in this flavour: all on "asyncio", none on "threads"; on
    "asyncio mixed" plain, async, and a plain handler; on "asyncio mixed, async outermost" async,
    plain, and an async handler (each passes between the loop and a thread both ways)."""
    if flavour in ("threads", "asyncio"):
        return flavour == "asyncio"
    first_async = flavour.endswith("async outermost")
    return first_async if position == -1 else (position % 2 == 0) == first_async


def pick(flavour: str, position: int, plain: Callable[..., Any], on_loop: Callable[..., Any]) -> Callable[..., Any]:
    """The part of the chain at ``position``, as the flavour has it: ``plain`` or ``on_loop`` (the
    same code as an ``async def``)."""
    return on_loop if as_async(flavour, position) else plain


def handler(flavour: str, body: Callable[[Job, JobContext], Any]) -> Callable[..., Any]:
    if not as_async(flavour, -1):
        return body

    async def on_loop(job: Job, ctx: JobContext) -> Any:
        await asyncio.sleep(0)
        return body(job, ctx)

    return on_loop


def test_two_middlewares_wrap_the_handler_the_first_registered_outermost(
        dsn: str, conn: psycopg.Connection, flavour: str) -> None:
    worker = new_worker(flavour)
    trail: list[str] = []

    def outer(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        trail.append("outer before")
        result = call_next()
        trail.append("outer after")
        return result

    async def outer_on_loop(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        trail.append("outer before")
        result = await call_next()
        trail.append("outer after")
        return result

    def inner(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        trail.append(f"inner before, job {job.id}")
        result = call_next()
        trail.append("inner after")
        return result

    async def inner_on_loop(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        trail.append(f"inner before, job {job.id}")
        result = await call_next()
        trail.append("inner after")
        return result

    def body(job: Job, ctx: JobContext) -> dict[str, Any]:
        trail.append("handler")
        return {"sum": job.payload["a"] + job.payload["b"]}

    first = worker.middleware(pick(flavour, 0, outer, outer_on_loop))
    worker.middleware(pick(flavour, 1, inner, inner_on_loop))
    assert first is worker._middleware[0]  # the decorator returns the function unchanged
    worker.handler("add")(handler(flavour, body))
    job_id = enqueue(conn, "add", '{"a": 2, "b": 3}')
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to finish")

    assert trail == ["outer before", f"inner before, job {job_id}", "handler", "inner after", "outer after"]
    assert (job(conn, job_id)["state"], job(conn, job_id)["result"]) == ("done", {"sum": 5})


def test_a_middleware_that_raises_retry_fails_the_attempt_for_a_retry_and_the_handler_is_not_run(
        dsn: str, conn: psycopg.Connection, flavour: str) -> None:
    worker = new_worker(flavour)
    ran: list[int] = []

    def not_now(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        if job.payload.get("busy"):
            raise Retry(delay=3600, reason="the downstream service is busy")
        return call_next()

    async def not_now_on_loop(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        if job.payload.get("busy"):
            raise Retry(delay=3600, reason="the downstream service is busy")
        return await call_next()

    worker.middleware(pick(flavour, 0, not_now, not_now_on_loop))
    worker.handler("work")(handler(flavour, lambda job, ctx: ran.append(job.id) or "ran"))
    busy = enqueue(conn, "work", '{"busy": true}', max_attempts=3)
    free = enqueue(conn, "work")
    with running(worker, dsn):
        wait_for(lambda: job(conn, busy)["last_error"] is not None and finished(conn, free)(), "both jobs")

    row = job(conn, busy)
    assert (row["state"], row["attempt"], row["last_error"]) == ("pending", 1, "the downstream service is busy")
    assert one(conn, "SELECT run_at > now() + interval '50 minutes' FROM pgq.jobs WHERE id = %s", (busy,))
    assert ran == [free] and job(conn, free)["state"] == "done"


def test_a_middleware_that_swallows_the_handlers_error_makes_the_job_done(
        dsn: str, conn: psycopg.Connection, flavour: str) -> None:
    worker = new_worker(flavour)
    reported: list[str] = []

    def reporter(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        try:
            return call_next()
        except ValueError as exc:
            reported.append(f"{job.kind}: {exc}")
            return {"ignored": str(exc)}

    async def reporter_on_loop(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        try:
            return await call_next()
        except ValueError as exc:
            reported.append(f"{job.kind}: {exc}")
            return {"ignored": str(exc)}

    def boom(job: Job, ctx: JobContext) -> Any:
        raise ValueError("bad input")

    worker.middleware(pick(flavour, 0, reporter, reporter_on_loop))
    worker.handler("boom")(handler(flavour, boom))
    job_id = enqueue(conn, "boom", max_attempts=3)
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job to finish")

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["result"]) == ("done", 1, {"ignored": "bad input"})
    assert reported == ["boom: bad input"]


def test_a_middleware_may_change_the_result_and_an_error_it_raises_fails_the_job(
        dsn: str, conn: psycopg.Connection, flavour: str) -> None:
    worker = new_worker(flavour)

    def wrapped(job: Job, result: Any) -> Any:
        if job.payload.get("refuse"):
            raise RuntimeError(f"the middleware refused {result!r}")
        return {"wrapped": result, "attempt": job.attempt}

    def wrap_result(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        return wrapped(job, call_next())

    async def wrap_result_on_loop(job: Job, ctx: JobContext, call_next: Callable[[], Any]) -> Any:
        return wrapped(job, await call_next())

    worker.middleware(pick(flavour, 0, wrap_result, wrap_result_on_loop))
    worker.handler("value")(handler(flavour, lambda job, ctx: job.payload["v"]))
    changed = enqueue(conn, "value", '{"v": 7}')
    refused = enqueue(conn, "value", '{"v": 8, "refuse": true}', max_attempts=1)
    none = enqueue(conn, "value", '{"v": null}')
    with running(worker, dsn):
        for job_id in (changed, refused, none):
            wait_for(finished(conn, job_id), f"job {job_id} to finish")

    assert job(conn, changed)["result"] == {"wrapped": 7, "attempt": 1}
    assert job(conn, none)["result"] == {"wrapped": None, "attempt": 1}
    row = job(conn, refused)
    assert row["state"] == "failed"
    assert "RuntimeError: the middleware refused 8" in row["last_error"]


def test_on_start_and_on_stop_run_once_per_run_around_the_work(
        dsn: str, conn: psycopg.Connection, flavour: str) -> None:
    worker = new_worker(flavour)
    trail: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            trail.append(what)

    def hook(name: str, position: int) -> Callable[[], Any]:
        async def on_loop() -> None:
            await asyncio.sleep(0)
            note(name)

        return pick(flavour, position, lambda: note(name), on_loop)

    assert worker.on_start(start := hook("start 1", 0)) is start
    worker.on_start(hook("start 2", 1))
    assert worker.on_stop(stop := hook("stop 1", 0)) is stop
    worker.on_stop(hook("stop 2", 1))
    worker.handler("work")(handler(flavour, lambda job, ctx: note(f"job {job.id}")))
    ids = [enqueue(conn, "work") for _ in range(3)]
    with running(worker, dsn):
        for job_id in ids:
            wait_for(finished(conn, job_id), f"job {job_id} to finish")
        assert trail[:2] == ["start 1", "start 2"]

    assert trail[:2] == ["start 1", "start 2"] and trail[-2:] == ["stop 1", "stop 2"]
    assert sorted(trail[2:-2]) == sorted(f"job {job_id}" for job_id in ids)


def test_an_on_start_that_raises_fails_the_run_before_anything_is_claimed(
        dsn: str, conn: psycopg.Connection, flavour: str) -> None:
    worker = new_worker(flavour)
    called: list[str] = []

    def broken() -> None:
        called.append("start 1")
        raise ConnectionRefusedError("the cache is down")

    worker.on_start(broken)
    worker.on_start(lambda: called.append("start 2"))
    worker.on_stop(lambda: called.append("stop"))
    worker.handler("work")(lambda job, ctx: called.append("handler"))
    job_id = enqueue(conn, "work")
    with pytest.raises(ConnectionRefusedError, match="the cache is down"):
        if isinstance(worker, AsyncWorker):
            asyncio.run(worker.run(dsn, install_signal_handlers=False))
        else:
            worker.run(dsn, install_signal_handlers=False)

    assert called == ["start 1"]
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["claimed_by"]) == ("pending", 0, None)


def test_an_on_stop_that_raises_is_raised_by_run_after_the_other_hooks_ran(
        dsn: str, conn: psycopg.Connection, flavour: str, caplog: pytest.LogCaptureFixture) -> None:
    worker = new_worker(flavour)
    called: list[str] = []

    def broken() -> None:
        called.append("stop 1")
        raise RuntimeError("flush failed")

    worker.on_stop(broken)
    worker.on_stop(lambda: called.append("stop 2"))
    worker.stop()  # stop() before run(): run() returns at once (its hooks still run)
    with pytest.raises(RuntimeError, match="flush failed"):
        if isinstance(worker, AsyncWorker):
            asyncio.run(worker.run(dsn, install_signal_handlers=False))
        else:
            worker.run(dsn, install_signal_handlers=False)
    assert called == ["stop 1", "stop 2"]
    assert any("on_stop hook" in r.getMessage() and "flush failed" in r.getMessage() for r in caplog.records)


def test_middleware_and_hooks_are_registered_before_run_only_and_must_be_functions(
        dsn: str, conn: psycopg.Connection) -> None:
    async def coroutine_function(*args: Any) -> None:
        return None

    for register in ("middleware", "on_start", "on_stop"):
        with pytest.raises(TypeError, match=f"{register} takes a function, got int"):
            getattr(Worker(), register)(42)
        with pytest.raises(TypeError, match="async def.*Worker cannot run"):
            getattr(Worker(), register)(coroutine_function)
        assert getattr(AsyncWorker(), register)(coroutine_function) is coroutine_function
    worker = new_worker("threads")
    started = threading.Event()
    worker.handler("work")(lambda job, ctx: started.set())
    enqueue(conn, "work")
    with running(worker, dsn):
        assert started.wait(DEADLINE)
        for register in ("middleware", "on_start", "on_stop"):
            with pytest.raises(RuntimeError, match=f"{register} must be registered before run"):
                getattr(worker, register)(lambda *args: None)
    assert worker._middleware == [] and worker._on_start == [] and worker._on_stop == []


def test_without_middleware_the_worker_runs_the_registered_handler_itself() -> None:
    """No call is added per job when no middleware is registered: the chain is the handler."""

    def work(job: Job, ctx: JobContext) -> None:
        return None

    assert chained(work, []) is work


def test_the_test_kit_drains_with_the_workers_middleware_and_hooks(dsn: str, conn: psycopg.Connection) -> None:
    trail: list[str] = []
    for kind in (Worker, AsyncWorker):
        worker = kind(["default"], poll_interval=0.1)
        worker.on_start(lambda: trail.append("start"))
        worker.on_stop(lambda: trail.append("stop"))
        worker.middleware(lambda job, ctx, call_next: {"wrapped": call_next()})
        worker.handler("work")(lambda job, ctx: job.payload["n"])
        job_id = enqueue(conn, "work", '{"n": 1}')
        result = drain(worker, dsn) if kind is Worker else asyncio.run(adrain(worker, dsn))
        assert result[job_id].result == {"wrapped": 1}
    assert trail == ["start", "stop", "start", "stop"]
