"""What a handler sees besides its job: its JobContext."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from datetime import datetime
from typing import Any

import psycopg

from pgq_thin.durations import Interval
from pgq_thin.errors import ConnectionLost, LeaseLost, PgqError, WrongState, translate
from pgq_thin.models import DependencyResult, Job
from pgq_thin.worker.durable import Steps
from pgq_thin.worker.transaction import HandlerTransaction

__all__ = ["DependencyResults", "Handler", "HandlerTransaction", "JobContext"]

#: The dependencies JobContext.dependency_results reads per call of pgq.dependency_results.
DEPENDENCY_PAGE = 100


class JobContext:
    """Handed to a handler with its job.

    ``lease_lost`` is set when the job is no longer ours (a renewal was refused, the renewals failed
    until the lease was about to end, or the worker gave the job back at shutdown): stop, since
    whatever the handler returns will be discarded.
    ``shutting_down`` is set when the worker stops claiming: finish soon, or be released after
    shutdown_timeout. ``deadline`` is when this attempt's max_run_time ends (the database's
    claimed_at + max_run_time; None without a limit): from then on ``should_stop`` is true, the
    lease is no longer renewed, ``lease_lost`` is set and the outcome is discarded (the database
    ends the attempt as timed_out). A long handler should check ``should_stop`` between steps,
    and may record a checkpoint with ``progress({...})`` that a retry finds in ``job.progress``.
    A job enqueued with ``depends_on`` reads how its dependencies ended (their results, errors)
    with ``dependency_results()``.

    ``cancelled`` turns true when the job is cancelled while it runs (pgq.cancel: its
    notification, then a renewal the database refuses); ``lease_lost`` is set with it, so
    ``should_stop`` is true and ``lease_lost.wait(timeout)`` returns at once. An ``async def``
    handler on an AsyncWorker is interrupted (asyncio.CancelledError); a plain one should stop
    when it sees it. Its outcome is discarded (the job is cancelled already).

    ``client`` is the worker's client: a Client for a Worker, an AsyncClient for an AsyncWorker.

    ``transaction()`` gives the handler a connection in a transaction whose end completes the
    job (pgq.complete in the same transaction): the handler's writes and the job's completion
    commit together or not at all. ``completed`` is true once such a transaction committed.

    Durable execution (pgq_thin.worker.durable): ``step(name, fn)`` runs ``fn`` once per job,
    whatever crashes, and returns its recorded result; ``sleep(delay)``, ``wait_for_signal(name,
    timeout)`` and ``wait_for_jobs(ids)`` may park the job (the attempt ends, the slot is free, the
    job runs again from the top once it may go on: they raise Parked, which the handler lets
    through); ``spawn(name, queue, kind, payload)`` enqueues a child once. ``parked`` is true once
    a call parked the job.

    A per-job facility (the deadline from the claimed row, a progress report) belongs here: both
    runtimes make the context in one way, from the claimed Job, the client and the stop flag
    (AsyncClaimer.hand_over_all, and the Claimer made of it); a method that calls ``client`` answers on a
    Worker and is awaited on an AsyncWorker, as the client's own methods are.
    """

    #: True once a ``transaction()`` block committed: the job is done, nothing more is recorded.
    completed = False
    # The worker's registry of held jobs (HeldJobs), set by HeldJobs.hold_all (None for a
    # context no worker holds): a transaction asks it for the job's one settling call.
    _registry: Any = None
    #: True once a durable wait (sleep, wait_for_signal, wait_for_jobs) ended the attempt in the
    #: database: the worker records nothing more for it.
    parked = False
    _steps: Steps | None = None  # made on first use: a job without steps costs nothing

    def __init__(self, job: Job, client: Any, worker_name: str,
                 shutting_down: threading.Event | None = None, *,
                 deadline_monotonic: float | None = None) -> None:
        self.job = job
        self.client = client
        self.worker_name = worker_name
        self.shutting_down = shutting_down if shutting_down is not None else threading.Event()
        #: This attempt's deadline by the database clock (Job.deadline), None without max_run_time.
        self.deadline: datetime | None = job.deadline
        #: The same instant on this process's monotonic clock (the claimer converts it).
        self.deadline_monotonic = deadline_monotonic
        # Made on first use: most jobs never need one, and an Event costs more to make than
        # the rest of a job's bookkeeping together.
        self._lease_lost: threading.Event | None = None
        self._cancelled = False

    @property
    def lease_lost(self) -> threading.Event:
        event = self._lease_lost
        if event is None:
            with _LEASE_LOST_MADE:
                if self._lease_lost is None:
                    self._lease_lost = threading.Event()
                event = self._lease_lost
        return event

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while it ran (pgq.cancel); see the class's notes."""
        return self._cancelled

    def _cancel(self) -> None:
        """The worker found the job cancelled: cancelled, then lease_lost (a handler woken by
        lease_lost sees cancelled true)."""
        self._cancelled = True
        self.lease_lost.set()

    @property
    def should_stop(self) -> bool:
        return self.is_lost() or self.shutting_down.is_set() or self.past_deadline()

    def past_deadline(self) -> bool:
        """Whether this attempt's max_run_time has run out (by the database clock)."""
        deadline = self.deadline_monotonic
        return deadline is not None and time.monotonic() >= deadline

    def progress(self, progress: dict[str, Any]) -> Any:
        """pgq.progress: store a checkpoint of this attempt (a JSON object) on the job; the next
        attempt finds it in ``job.progress``. True when stored; False (and ``lease_lost`` set) when
        the job is no longer ours. On an AsyncWorker, await it."""
        answer = self.client.progress(self.job.id, self.job.attempt, progress)
        if inspect.isawaitable(answer):
            return self._checked(answer)
        return self._stored(bool(answer))

    def dependency_results(self) -> DependencyResults:
        """pgq.dependency_results, page by page: how each dependency of this job ended (a
        DependencyResult: its id, state, result, last error and end; state None when it was
        pruned), by id. On a Worker iterate it (``for dep in context.dependency_results()``); on an
        AsyncWorker, ``async for`` it, or await it for a list. Reading it is an owner operation:
        when the job is no longer ours it raises WrongState (and sets ``lease_lost``)."""
        return DependencyResults(self)

    async def _checked(self, answer: Any) -> bool:
        return self._stored(bool(await answer))

    def transaction(self, result: Any = None) -> HandlerTransaction:
        """A connection of the worker's pool in a transaction, for the handler's own writes; the
        end of the block completes the job in that transaction (pgq.complete with ``result``, or
        with what the handler set as ``.result`` on the object this returns before the block
        ends), then commits. The effect and the completion commit together or not at all::

            with ctx.transaction(result={"charged": True}) as conn:        # on a Worker
                conn.execute("INSERT INTO charges (order_id) VALUES (%s)", (job.payload["order"],))

            async with ctx.transaction() as conn:                          # on an AsyncWorker
                await conn.execute(...)

        When the job is no longer ours at the block's end (the lease was lost and another attempt
        took it, it was cancelled, or max_run_time ran out), the completion is refused: the whole
        transaction rolls back, ``lease_lost`` is set and LeaseLost (a WrongState) is raised. An
        exception inside the block rolls the transaction back and propagates: the worker records
        it as it records any exception of the handler (a failure, retried; Retry, Snooze...).
        After a committed block the job is done: the worker records nothing more for this
        attempt, whatever the handler returns or raises afterwards (``completed`` is true).

        The connection is one of the worker's pool (``concurrency`` + 3 connections: one per
        slot), held for the block's length: inside it send everything through ``conn``
        (``ctx.client.enqueue(..., conn=conn)`` to enqueue with the effect); a pooled call
        inside the block borrows a second connection. The connection goes back to the pool
        afterwards: change settings with SET LOCAL (a plain SET would outlive the block). It is
        one transaction, so it works behind PgBouncer in transaction mode as well. Keep the
        default isolation (READ COMMITTED): under REPEATABLE READ a renewal of the lease during
        the block makes the completion a serialization failure. A result JSON cannot carry is refused
        (BadArgument) when given, before anything is sent. On an AsyncWorker use ``async with``
        in an ``async def`` handler."""
        return HandlerTransaction(self, result)

    # Durable execution --------------------------------------------------------------------------

    def durable(self) -> Steps:
        steps = self._steps
        if steps is None:
            steps = self._steps = Steps(self)
        return steps

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, transaction: bool = False,
             **kwargs: Any) -> Any:
        """A step that runs once per job: the result recorded for ``name`` (pgq.get_step) when
        there is one, else ``fn(*args, **kwargs)``'s, recorded (pgq.record_step) and returned as
        recorded (any JSON value, read back from its JSON). A recorded step costs one round trip;
        a new one two, and its run. With ``transaction=True``, ``fn(conn, *args, **kwargs)`` runs
        with a connection of the worker's pool in a transaction that ends with the record: the
        step's own writes and its record commit together or not at all (an exception in ``fn``
        rolls both back and propagates).

        Names: the n-th call of a name in one run (n >= 2) is the step ``name#n`` (step, sleep
        and spawn names count together), so a loop's iterations are told apart by their order;
        or name them yourself (``f"charge-{i}"``). When the job is no longer this attempt's the
        call raises LeaseLost (and sets ``lease_lost``): the handler stops, its outcome is
        discarded. On an AsyncWorker, await it; ``fn`` may be an ``async def`` there (a plain
        one runs on the loop: keep it short, or give it to a thread)."""
        return self.durable().step(name, fn, args, kwargs, transaction)

    def sleep(self, delay: Interval, name: str = "sleep") -> Any:
        """A durable sleep (pgq.sleep): step ``name`` records the wake time, now + ``delay``
        (seconds, a timedelta or a duration such as ``"5m"``), once. While it is ahead the
        attempt ends (no attempt used, the slot freed) and Parked is raised: let it through, the
        job runs again from the top at that time. Once it has passed, returns None. Names repeat
        as step's do. On an AsyncWorker, await it."""
        return self.durable().sleep(delay, name)

    def wait_for_signal(self, name: str, timeout: Interval | None = None) -> Any:
        """Wait for signal ``name`` of the job's queue (pgq.await_signal; a producer sends it with
        client.signal or pgq-thin signal): its payload once it has come; SignalTimeout (a
        TimeoutError) once the wait passed ``timeout`` (seconds, a timedelta or a duration such as
        ``"1h"``; None: no timeout); otherwise the job is parked until one of them (Parked is raised: let it
        through). The answer is recorded: a later run is told the same. On an AsyncWorker, await
        it."""
        return self.durable().wait_for_signal(name, timeout)

    def spawn(self, name: str, queue: str, kind: str, payload: dict[str, Any] | None = None) -> Any:
        """Enqueue the child ``name`` once (pgq.spawn): its job id; a later call of the name, in
        any run, returns the same id. The child carries the workflow's root (``workflow_id``).
        Names repeat as step's do. On an AsyncWorker, await it."""
        return self.durable().spawn(name, queue, kind, payload)

    def wait_for_jobs(self, ids: Sequence[int]) -> Any:
        """Wait until every job of ``ids`` has ended (pgq.await_jobs): then how each ended, by id
        (a JobOutcome: its state, result, last error), read with pgq.job_outcomes; until then the
        job is parked (Parked is raised: let it through) and runs again from the top once they
        have. On an AsyncWorker, await it."""
        return self.durable().wait_for_jobs(ids)

    # The seam HandlerTransaction uses (transaction.TransactionSeam): whether a block may begin,
    # the job's one settling call asked for and given back, and what a refusal or a failed COMMIT
    # raises. Not for handlers.

    def may_begin(self) -> None:
        """Before a transaction's block: a job completed already, or no longer ours, is refused."""
        if self.completed:
            raise RuntimeError(f"job {self.job.id} was completed by an earlier ctx.transaction() of this attempt")
        if self.ended():
            raise self.refused()

    def refused(self) -> LeaseLost:
        self.lease_lost.set()
        job = self.job
        return LeaseLost(f"job {job.id} is no longer attempt {job.attempt}'s (its lease was lost, it was cancelled, "
                         "or its max_run_time ran out): the handler's transaction was rolled back")

    def grant(self) -> bool | None:
        """Ask the registry for the job's one settling call: True (granted: ours to complete, and
        nobody else's), False (settled already, or no longer ours), None (a renewal is in
        flight: ask again). True without a registry."""
        registry = self._registry
        if registry is None:
            return True
        held = registry.entry_of(self)
        if held is None:
            return False
        verdict = registry.settle(held).value
        return None if verdict == "busy" else verdict == "granted"

    def ungrant(self) -> None:
        """The completion surely did not commit: the job is held again, and the handler's
        outcome is recorded as usual."""
        registry = self._registry
        held = None if registry is None else registry.entry_of(self)
        if held is not None:
            registry.unsettle(held)

    def commit_failed(self, exc: psycopg.Error) -> PgqError:
        """COMMIT raised ``exc``: the job is held again when the server refused the commit (it
        rolled back); a broken connection leaves it unknown whether it committed, so the job is
        no longer ours to record (the lease recovers it if it did not commit)."""
        error = translate(exc)
        if isinstance(error, ConnectionLost):
            self.lease_lost.set()
            return ConnectionLost(f"the connection broke while committing the transaction of job {self.job.id}: "
                                  f"it may or may not have committed ({error.message}); if it did not, the job's "
                                  "lease recovers it", error.sqlstate, error.hint)
        self.ungrant()
        return error

    def _stored(self, stored: bool) -> bool:
        if not stored:
            self.lease_lost.set()
        return stored

    def is_lost(self) -> bool:
        """lease_lost.is_set(), without making the Event."""
        event = self._lease_lost
        return event is not None and event.is_set()

    def ended(self) -> bool:
        """is_lost() or past_deadline(): this attempt is no longer ours to record (one call, as
        the registry asks once per job)."""
        event = self._lease_lost
        if event is not None and event.is_set():
            return True
        deadline = self.deadline_monotonic
        return deadline is not None and time.monotonic() >= deadline

    def __repr__(self) -> str:
        return f"JobContext(job={self.job!r}, worker_name={self.worker_name!r})"


class DependencyResults:
    """What JobContext.dependency_results returns: an iterator on a Worker, an async iterator (or,
    awaited, a list) on an AsyncWorker, each reading pgq.dependency_results DEPENDENCY_PAGE rows at
    a time (after the last id read) for the context's job and attempt."""

    def __init__(self, context: JobContext) -> None:
        self._context = context

    def _page(self, after_id: int | None) -> Any:
        """The client's answer for the page after ``after_id`` (to await, on an AsyncWorker)."""
        job = self._context.job
        return self._context.client.dependency_results(job.id, job.attempt, limit_rows=DEPENDENCY_PAGE,
                                                       after_id=after_id)

    def _lost(self) -> None:
        self._context.lease_lost.set()

    def __iter__(self) -> Iterator[DependencyResult]:
        after_id: int | None = None
        while True:
            try:
                page = self._page(after_id)
            except WrongState:
                self._lost()
                raise
            if inspect.isawaitable(page):
                close = getattr(page, "close", None)
                if close is not None:
                    close()  # never awaited: no "was never awaited" warning
                raise TypeError("on an AsyncWorker, read context.dependency_results() with async for "
                                "(or await it for a list)")
            yield from page
            if len(page) < DEPENDENCY_PAGE:
                return
            after_id = page[-1].dependency_id

    async def __aiter__(self) -> AsyncIterator[DependencyResult]:
        after_id: int | None = None
        while True:
            answer = self._page(after_id)
            if not inspect.isawaitable(answer):
                raise TypeError("on a Worker, read context.dependency_results() with for (async for and "
                                "await are for an AsyncWorker)")
            try:
                page: list[DependencyResult] = await answer
            except WrongState:
                self._lost()
                raise
            for row in page:
                yield row
            if len(page) < DEPENDENCY_PAGE:
                return
            after_id = page[-1].dependency_id

    def __await__(self) -> Generator[Any, None, list[DependencyResult]]:
        return self._all().__await__()

    async def _all(self) -> list[DependencyResult]:
        return [row async for row in self]

    def __repr__(self) -> str:
        return f"<dependency results of job {self._context.job.id}, attempt {self._context.job.attempt}>"


_LEASE_LOST_MADE = threading.Lock()  # makes JobContext.lease_lost once per job, whoever asks first

#: A handler: called with the job and its context; its return value becomes the job's result.
#: On an AsyncWorker it may be an ``async def``.
Handler = Callable[[Job, JobContext], Any]
