"""Durable execution in a handler: what JobContext's ``step``, ``sleep``, ``wait_for_signal``,
``spawn`` and ``wait_for_jobs`` do (docs/sql-api.md, "Durable execution", is the contract they
call). Both runtimes use this one module: on a Worker each call answers, on an AsyncWorker it
returns an awaitable (the context's client says which), as ``ctx.progress`` does.

A job that calls none of them costs nothing: the context makes its Steps on first use.

**Steps.** ``step(name, fn)`` reads the step (pgq.get_step: one round trip); when it is recorded
it returns the recorded result, else it runs ``fn`` and records what it returned
(pgq.record_step), and returns it as recorded (read back from its JSON, so the first run and a
replay see the same value). With ``transaction=True``, ``fn(conn)`` runs in a transaction of a
connection of the worker's pool, and the record is the last statement of that transaction: the
step's writes and its record commit together or not at all.

**Parking.** ``sleep``, ``wait_for_signal`` and ``wait_for_jobs`` may end the attempt in the
database (pgq.sleep, pgq.await_signal, pgq.await_jobs answer "sleeping" / "waiting"). Each takes
the job's one settling call from the held-jobs registry before it calls (as ctx.transaction()'s
completion does: the renewer leaves the job alone meanwhile), gives it back when the answer lets
the handler go on, and otherwise keeps it and raises Parked: the handler stops, and the worker
records nothing for the attempt (the database ended it) and frees the slot.

**Not ours.** A call the database answers "not yours" (a stale attempt: the lease passed and
another worker took the job, it was cancelled, its max_run_time ran out) sets ``lease_lost`` and
raises LeaseLost: the handler stops, and the worker discards its outcome.

**Repeated names.** One run numbers the calls of a name (step, sleep and spawn names are one
namespace): the n-th call of ``name`` (n >= 2) is the step ``name#n``. A handler that takes the
same path through its steps on every run (it branches only on recorded results) so names the same
steps each time; a loop may also name its iterations itself (``f"charge-{i}"``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import psycopg

from pgq_thin import calls
from pgq_thin.async_client import AsyncClient
from pgq_thin.durations import Interval
from pgq_thin.errors import LeaseLost, translate, translated
from pgq_thin.models import Job, JobOutcome

__all__ = ["OUTCOMES_PAGE", "DurableSeam", "Parked", "SignalTimeout", "Steps"]

#: The ids pgq.job_outcomes answers per call (its limit).
OUTCOMES_PAGE = 1000


class Parked(BaseException):
    """A parking call ended the handler's attempt: the job sleeps, or waits for a signal or for
    jobs, and runs again from the top when it may go on. Raised by ``ctx.sleep``,
    ``ctx.wait_for_signal`` and ``ctx.wait_for_jobs``; the worker records nothing for the attempt.

    A BaseException (as asyncio.CancelledError is), so that a handler's ``except Exception`` does
    not swallow it: let it propagate. A handler (or middleware) that catches it anyway changes
    nothing: the attempt has ended in the database, and what it returns or raises is discarded."""

    def __init__(self, job: Job, why: str) -> None:
        super().__init__(f"job {job.id} attempt {job.attempt} parked: {why}")
        self.why = why


class SignalTimeout(TimeoutError):
    """``ctx.wait_for_signal(name, timeout)``: the wait for signal ``name`` passed its timeout
    (pgq.await_signal answered timed_out). It stays so: every later run of the job is told the
    same, even when the signal comes later."""

    def __init__(self, name: str, timeout: Interval | None) -> None:
        shown = ("" if timeout is None else f" {timeout}" if isinstance(timeout, (timedelta, str))
                 else f" {timeout} s")
        super().__init__(f"signal {name!r} did not come within its timeout{shown}")
        self.name = name
        self.timeout = timeout


class DurableSeam(Protocol):
    """What Steps asks of its job's context (JobContext)."""

    job: Job
    client: Any
    parked: bool

    @property
    def lease_lost(self) -> threading.Event:
        """Set when the job is no longer ours."""

    def grant(self) -> bool | None:
        """The job's one settling call: True (ours), False (not), None (a renewal is in flight)."""

    def ungrant(self) -> None:
        """Give the settling call back: the job is held again."""


class Steps:
    """One attempt's durable calls (JobContext makes it on first use): its context and the names
    this run has met, for the numbering of repeats."""

    def __init__(self, ctx: DurableSeam) -> None:
        self.ctx = ctx
        self.is_async = isinstance(ctx.client, AsyncClient)
        self._seen: dict[str, int] = {}

    def name_of(self, name: str) -> str:
        """The step's name in this run: ``name``, then ``name#2``, ``name#3``... (TypeError for a
        name that is not a str; the server checks the rest: 1 to 256 characters, no ``signal:``)."""
        if not isinstance(name, str):
            raise TypeError(f"a step's name must be a str, got {type(name).__name__}")
        n = self._seen[name] = self._seen.get(name, 0) + 1
        return name if n == 1 else f"{name}#{n}"

    def not_ours(self, call: str) -> LeaseLost:
        """The database answered ``call`` "not yours": the handler stops (lease_lost is set)."""
        self.ctx.lease_lost.set()
        job = self.ctx.job
        return LeaseLost(f"job {job.id}: {call} refused: attempt {job.attempt} is no longer the job's (its lease "
                         "was lost and another attempt took it, it was cancelled, or its max_run_time ran out); "
                         "the handler stops and its outcome is discarded")

    def parked(self, why: str) -> Parked:
        self.ctx.parked = True
        return Parked(self.ctx.job, why)

    def recording(self, key: str, result: Any, conn: Any = None) -> tuple[calls.Call[bool], Any]:
        """The pgq.record_step call, and the result as it will be recorded (its JSON read back)."""
        job = self.ctx.job
        call = calls.record_step(job.id, job.attempt, key, result, conn=conn)
        return call, json.loads(call.params["result"].obj)

    # On a Worker ---------------------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             transaction: bool) -> Any:
        if self.is_async:
            _on_the_loop("step")
            return self.astep(name, fn, args, kwargs, transaction)
        ctx, job = self.ctx, self.ctx.job
        key = self.name_of(name)
        found = ctx.client.get_step(job.id, job.attempt, key)
        if found is None:
            raise self.not_ours(f"get_step {key!r}")
        if found.found:
            return found.result
        if transaction:
            return self.in_transaction(key, fn, args, kwargs)
        call, recorded = self.recording(key, _ran(fn(*args, **kwargs), key))
        if not ctx.client._send(call):
            raise self.not_ours(f"record_step {key!r}")
        return recorded

    def in_transaction(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
        client = self.ctx.client
        with translated():
            borrowed = client.pool.connection()
            conn = borrowed.__enter__()
        try:
            leaving = False  # fn returned: what psycopg raises from now on is the COMMIT's
            with conn.transaction():
                result = _ran(fn(conn, *args, **kwargs), key)
                leaving = True
                call, recorded = self.recording(key, result, conn)
                if not client._send(call):
                    raise self.not_ours(f"record_step {key!r}")  # rolls the step's writes back
        except psycopg.Error as exc:
            if not leaving:
                raise  # the step's own statement: as psycopg raised it
            raise translate(exc) from exc
        finally:
            borrowed.__exit__(None, None, None)
        return recorded

    def settling(self) -> None:
        """Take the job's settling call before a call that may park it (LeaseLost when it is not
        ours any more)."""
        while (granted := self.ctx.grant()) is None:
            time.sleep(0.002)  # a renewal answers within one round trip
        if not granted:
            raise self.not_ours("a durable wait")

    def park(self, call: str, send: Callable[[], Any], parks: Callable[[Any], str | None]) -> Any:
        """Send ``send()`` holding the settling call: its answer when the handler goes on;
        Parked when ``parks(answer)`` says why the attempt ended; LeaseLost when not ours."""
        self.settling()
        try:
            answer = send()
        except BaseException:
            self.ctx.ungrant()
            raise
        return self.parked_or(call, answer, parks)

    def parked_or(self, call: str, answer: Any, parks: Callable[[Any], str | None]) -> Any:
        if answer is None:
            raise self.not_ours(call)  # (the settling call stays taken: the attempt is not ours)
        why = parks(answer)
        if why is not None:
            raise self.parked(why)
        self.ctx.ungrant()
        return answer

    def sleep(self, delay: Interval, name: str) -> Any:
        if self.is_async:
            _on_the_loop("sleep")
            return self.asleep(delay, name)
        job, key = self.ctx.job, self.name_of(name)
        call = calls.sleep(job.id, job.attempt, key, delay)  # bad input: refused before the grant
        self.park(f"sleep {key!r}", lambda: self.ctx.client._send(call), _sleeping)
        return None

    def wait_for_signal(self, name: str, timeout: Interval | None) -> Any:
        if self.is_async:
            _on_the_loop("wait_for_signal")
            return self.await_signal(name, timeout)
        job = self.ctx.job
        call = calls.await_signal(job.id, job.attempt, name, timeout)
        answer = self.park(f"await_signal {name!r}", lambda: self.ctx.client._send(call), _waiting_for(name))
        return _signalled(answer, name, timeout)

    def spawn(self, name: str, queue: str, kind: str, payload: dict[str, Any] | None) -> Any:
        if self.is_async:
            _on_the_loop("spawn")
            return self.aspawn(name, queue, kind, payload)
        job, key = self.ctx.job, self.name_of(name)
        child = self.ctx.client.spawn(job.id, job.attempt, key, queue, kind, payload)
        if child is None:
            raise self.not_ours(f"spawn {key!r}")
        return child

    def wait_for_jobs(self, ids: Sequence[int]) -> Any:
        if self.is_async:
            _on_the_loop("wait_for_jobs")
            return self.await_jobs(ids)
        job = self.ctx.job
        call = calls.await_jobs(job.id, job.attempt, ids)
        self.park("await_jobs", lambda: self.ctx.client._send(call), _jobs_waiting)
        ended: dict[int, JobOutcome] = {}
        for page in _pages(ids):
            ended.update(self.outcomes(self.ctx.client.job_outcomes(job.id, job.attempt, page)))
        return ended

    def outcomes(self, rows: list[JobOutcome]) -> dict[int, JobOutcome]:
        if not rows:
            raise self.not_ours("job_outcomes")
        return {row.job_id: row for row in rows}

    # On an AsyncWorker ---------------------------------------------------------------------------

    async def astep(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    transaction: bool) -> Any:
        ctx, job = self.ctx, self.ctx.job
        key = self.name_of(name)
        found = await ctx.client.get_step(job.id, job.attempt, key)
        if found is None:
            raise self.not_ours(f"get_step {key!r}")
        if found.found:
            return found.result
        if transaction:
            return await self.ain_transaction(key, fn, args, kwargs)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        call, recorded = self.recording(key, result)
        if not await ctx.client._send(call):
            raise self.not_ours(f"record_step {key!r}")
        return recorded

    async def ain_transaction(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...],
                              kwargs: dict[str, Any]) -> Any:
        client = self.ctx.client
        await client.open()
        with translated():
            borrowed = client.pool.connection()
            conn = await borrowed.__aenter__()
        try:
            leaving = False
            async with conn.transaction():
                result = fn(conn, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                leaving = True
                call, recorded = self.recording(key, result, conn)
                if not await client._send(call):
                    raise self.not_ours(f"record_step {key!r}")
        except psycopg.Error as exc:
            if not leaving:
                raise
            raise translate(exc) from exc
        finally:
            await borrowed.__aexit__(None, None, None)
        return recorded

    async def asettling(self) -> None:
        while (granted := self.ctx.grant()) is None:
            await asyncio.sleep(0.002)
        if not granted:
            raise self.not_ours("a durable wait")

    async def apark(self, call: str, send: Callable[[], Any], parks: Callable[[Any], str | None]) -> Any:
        await self.asettling()
        try:
            answer = await send()
        except BaseException:
            self.ctx.ungrant()
            raise
        return self.parked_or(call, answer, parks)

    async def asleep(self, delay: Interval, name: str) -> None:
        job, key = self.ctx.job, self.name_of(name)
        call = calls.sleep(job.id, job.attempt, key, delay)
        await self.apark(f"sleep {key!r}", lambda: self.ctx.client._send(call), _sleeping)

    async def await_signal(self, name: str, timeout: Interval | None) -> Any:
        job = self.ctx.job
        call = calls.await_signal(job.id, job.attempt, name, timeout)
        answer = await self.apark(f"await_signal {name!r}", lambda: self.ctx.client._send(call), _waiting_for(name))
        return _signalled(answer, name, timeout)

    async def aspawn(self, name: str, queue: str, kind: str, payload: dict[str, Any] | None) -> int:
        job, key = self.ctx.job, self.name_of(name)
        child = await self.ctx.client.spawn(job.id, job.attempt, key, queue, kind, payload)
        if child is None:
            raise self.not_ours(f"spawn {key!r}")
        return int(child)

    async def await_jobs(self, ids: Sequence[int]) -> dict[int, JobOutcome]:
        job = self.ctx.job
        call = calls.await_jobs(job.id, job.attempt, ids)
        await self.apark("await_jobs", lambda: self.ctx.client._send(call), _jobs_waiting)
        ended: dict[int, JobOutcome] = {}
        for page in _pages(ids):
            ended.update(self.outcomes(await self.ctx.client.job_outcomes(job.id, job.attempt, page)))
        return ended


def _on_the_loop(method: str) -> None:
    """On an AsyncWorker the calls are awaited, in an ``async def`` handler: a plain handler (in a
    handler thread, with no loop) would get a coroutine it cannot await, and nothing would happen."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise TypeError(f"ctx.{method}() on an AsyncWorker is awaited in an async def handler; a plain handler "
                        "runs in a thread, where it cannot be (make the handler async def, or use a Worker)") from None


def _ran(result: Any, key: str) -> Any:
    """What a step's function returned, on a Worker (where nothing awaits a coroutine)."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()  # never awaited: no "was never awaited" warning
        raise TypeError(f"step {key!r}: its function returned an awaitable, which a Worker cannot await "
                        "(use a plain function, or an AsyncWorker)")
    return result


def _sleeping(answer: Any) -> str | None:
    return f"sleeping until {answer.wake_at}" if answer.status == "sleeping" else None


def _waiting_for(name: str) -> Callable[[Any], str | None]:
    return lambda answer: f"waiting for signal {name!r}" if answer.status == "waiting" else None


def _jobs_waiting(answer: Any) -> str | None:
    return "waiting for jobs to end" if answer == "waiting" else None


def _signalled(answer: Any, name: str, timeout: Interval | None) -> Any:
    if answer.status == "timed_out":
        raise SignalTimeout(name, timeout)
    return answer.payload


def _pages(ids: Sequence[int]) -> list[list[int]]:
    """The distinct ids, OUTCOMES_PAGE at a time (pgq.await_jobs has checked them)."""
    unique = list(dict.fromkeys(int(i) for i in ids))
    return [unique[n:n + OUTCOMES_PAGE] for n in range(0, len(unique), OUTCOMES_PAGE)]

