"""The parts of AsyncWorker that wait for the database, as asyncio tasks. Their rules are the
thread runtime's, from the same objects: the held-jobs registry decides what is settled, the
prefetch policy how much to claim, outcomes.py which call records a handler's outcome, the poll
timer when to look again, Repeat when to repeat a call, the database clock how long a lease is.
What differs is only how each part waits (await instead of a blocked thread)."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg

from pgq_thin import queries
from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PgqError
from pgq_thin.models import Job, UnreadableJson
from pgq_thin.worker import outcomes
from pgq_thin.worker.claimer import UNDEFINED_FUNCTION, CarryRules, PollTimer
from pgq_thin.worker.completer import CARRY_MAX, CARRY_PATIENCE, report
from pgq_thin.worker.context import Handler, JobContext
from pgq_thin.worker.held import GRANTED, Held, HeldJobs, Verdict, discarded
from pgq_thin.worker.listener import CancelNoticed, Reconnects, heard
from pgq_thin.worker.metrics import JobWatch, WorkerMetrics
from pgq_thin.worker.middleware import Middleware, chained_async, threads_per_job
from pgq_thin.worker.owner import released
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock, renewal_failed, renewed, until_next
from pgq_thin.worker.support import KEEPALIVES, Backoff, Delay, Flags, JobLog, Repeat, log, transient

__all__ = ["AsyncClaimer", "AsyncCompleter", "AsyncListener", "AsyncOwnerCalls", "AsyncRenewer", "AsyncSlots"]


async def nap(seconds: float, flags: Flags, until: asyncio.Event | None = None) -> None:
    """Sleep ``seconds``, or less: until ``until`` is set, or a hard stop."""
    deadline = time.monotonic() + seconds
    while not flags.hard_stop.is_set() and (left := deadline - time.monotonic()) > 0:
        if until is None:
            await asyncio.sleep(min(left, 0.05))
            continue
        try:
            await asyncio.wait_for(until.wait(), min(left, 0.05))
            return
        except TimeoutError:
            continue


class AsyncOwnerCalls:
    """OwnerCalls for asyncio (see pgq_thin.worker.owner for what each call means)."""

    def __init__(self, client: AsyncClient, held: HeldJobs, flags: Flags, worker_name: str) -> None:
        self.client = client
        self.held = held
        self.flags = flags
        self.worker_name = worker_name

    async def granted(self, held: Held) -> bool:
        while (verdict := self.held.settle(held)) is Verdict.BUSY:
            await asyncio.sleep(0.002)  # a renewal answers within one round trip
        return verdict is Verdict.GRANTED

    async def settle(self, held: Held, outcome: outcomes.Outcome) -> None:
        try:
            if not await self.granted(held):
                discarded(held, outcome.operation)
                return
            try:
                answer = await self.until_answered(outcome.operation, held.log,
                                                   lambda: outcome.send(self.client, held.job))
            except Exception as exc:  # noqa: BLE001
                await self.refused(outcome.operation, held, exc)
                return
            if (answer is None or answer is False) and self.held.cancel_noticed(held):
                held.log.info("%s refused: the job was cancelled (pgq.cancel) while it ran", outcome.operation)
            else:
                outcome.answered(held.log, answer)
        finally:
            self.held.forget([held])

    async def until_answered(self, operation: str, jlog: JobLog, call: Callable[[], Awaitable[Any]]) -> Any:
        repeat = Repeat(operation, jlog, self.flags)
        while True:
            try:
                return await call()
            except Exception as exc:
                delay = repeat.after(exc)
                await self.drop_broken_connections()
                await nap(delay, self.flags)

    async def refused(self, operation: str, held: Held, exc: Exception) -> None:
        instead = outcomes.refused_instead(operation, exc, held.log)
        if instead is None:
            return
        try:
            state = await self.until_answered("fail", held.log, lambda: instead.send(self.client, held.job))
            held.log.info("recorded as a failure instead: %s", outcomes.failed_as(state))
        except Exception as again:  # noqa: BLE001
            held.log.error("fail refused too (%s); the lease will recover the job", again)

    async def give_back(self, job: Job, why: str) -> None:
        try:
            released(job, await self.client.release(job.id, job.attempt), why)
        except PgqError as exc:
            JobLog(job).warning("release failed (%s); the lease will recover the job", exc)

    async def give_back_unstarted(self, held: Held, why: str) -> None:
        if await self.granted(held):
            await self.give_back(held.job, why)
        self.held.forget([held])

    async def drop_broken_connections(self) -> None:
        if not self.flags.done.is_set():
            try:
                await self.client.pool.check()
            except Exception as exc:  # noqa: BLE001 - best effort; the next call reports real trouble
                log.debug("pool check failed: %s", exc, extra={"worker": self.worker_name})


class AsyncCompleter:
    """Completer for asyncio: ``add()`` queues, its task records all that is queued in one
    pgq.complete_many, unless the claimer carries it (Completer's rules: carry, take, settled,
    give_back, CARRY_PATIENCE)."""

    def __init__(self, owner: AsyncOwnerCalls, held: HeldJobs, flags: Flags,
                 recorded: Callable[[], None] = lambda: None) -> None:
        self.owner = owner
        self.held = held
        self.flags = flags
        self.recorded = recorded  # called after each batch is settled (Completer.recorded)
        self.carried = False  # the claimer takes the queue with its next call (Completer.carry)
        self._queue: list[Held] = []
        self._since = 0.0  # when the oldest completion queued was queued (time.monotonic())
        self._queued = asyncio.Event()
        self._stopped = False

    async def add(self, held: Held) -> bool:
        if self.held.settle(held) is not GRANTED and not await self.owner.granted(held):
            discarded(held, "complete")
            return False
        if not self._queue:
            self._since = time.monotonic()
        self._queue.append(held)
        if not self.carried:
            self._queued.set()
        return True

    @property
    def queued(self) -> int:
        return len(self._queue)

    def carry(self, on: bool) -> None:
        self.carried = on
        if not on and self._queue:
            self._queued.set()

    def take(self, most: int | None = None) -> list[Held]:
        queue = self._queue
        if most is None or len(queue) <= most:
            self._queue = []
            return queue
        batch, self._queue = queue[:most], queue[most:]
        self._queued.set()
        return batch

    def settled(self, batch: list[Held], done: Sequence[int]) -> None:
        report(batch, done, self.held.cancel_noticed)
        self.held.forget(batch)

    def give_back(self, batch: list[Held]) -> None:
        if not batch:
            return
        if not self._queue:
            self._since = time.monotonic()
        self._queue[:0] = batch
        self._queued.set()

    async def flush(self) -> None:
        batch = self.take()
        if not batch:
            return
        try:
            done = await self.owner.client.complete_many([h.job.id for h in batch], [h.job.attempt for h in batch])
        except Exception as exc:
            if transient(exc) and not self.flags.done.is_set():
                self._queue[:0] = batch
                raise
            for held in batch:
                await self.owner.refused("complete", held, exc)
            self.held.forget(batch)
            self.recorded()
            return
        self.settled(batch, done)
        self.recorded()

    async def try_flush(self) -> None:
        try:
            await self.flush()
        except PgqError as exc:
            log.warning("complete_many did not reach the server at shutdown (%s); the leases cover "
                        "those jobs", exc, extra={"worker": self.owner.worker_name})

    def _overdue(self) -> bool:
        return bool(self._queue) and time.monotonic() - self._since >= CARRY_PATIENCE

    async def run(self) -> None:
        errors = Backoff(first=0.1, cap=10.0)
        while not self._stopped and not self.flags.hard_stop.is_set():
            if not self._queued.is_set():
                await nap(CARRY_PATIENCE, self.flags, self._queued)
                if not self._queued.is_set() and not self._overdue():
                    continue
            self._queued.clear()
            try:
                await self.flush()
            except PgqError as exc:  # a connection error: the batch stays queued; try again
                delay = errors.next()
                log.warning("complete_many did not reach the server (%s); repeating it in %.1fs", exc, delay,
                            extra={"worker": self.owner.worker_name})
                await self.owner.drop_broken_connections()
                self._queued.set()
                await nap(delay, self.flags)
                continue
            errors.reset()

    def stop(self) -> None:
        self._stopped = True
        self._queued.set()


class AsyncRenewer:
    """Renewer for asyncio: renews each held job at about a third of its lease."""

    def __init__(self, client: AsyncClient, held: HeldJobs, clock: DatabaseClock, flags: Flags,
                 lease: Delay | None) -> None:
        self.client = client
        self.held = held
        self.clock = clock
        self.flags = flags
        self.lease = lease
        self._stopped = asyncio.Event()
        self._wake = asyncio.Event()  # set by stop() and wake()

    def wake(self) -> None:
        """Renew what is due at once (call in the loop's thread; Renewer.wake)."""
        self._wake.set()

    async def renew(self, held: Held) -> None:
        if not self.held.begin_renewal(held):
            return
        lost = answered = False
        try:
            lost = renewed(held, await self.client.renew(held.job.id, held.job.attempt, lease=self.lease),
                           self.clock, self.lease)
            answered = True
        except PgqError as exc:
            renewal_failed(held, exc)
        finally:
            self.held.end_renewal(held, lost=lost, answered=answered)

    async def run(self) -> None:
        while not self._stopped.is_set() and not self.flags.hard_stop.is_set():
            now = time.monotonic()
            await asyncio.gather(*(self.renew(h) for h in self.held.jobs() if h.next_renew <= now))
            await nap(until_next(self.held, now), self.flags, self._wake)
            self._wake.clear()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()


async def read_clock(clock: DatabaseClock, client: AsyncClient) -> None:
    """DatabaseClock.read for an AsyncClient."""
    try:
        async with client.pool.connection() as conn:
            before = time.time()
            row = await (await conn.execute(queries.CLOCK)).fetchone()
            after = time.time()
    except psycopg.Error as exc:
        log.debug("could not read the database clock: %s", exc)
        return
    if row is not None:
        clock.observe(before, row[0], after)


class AsyncListener:
    """Listener for asyncio: LISTEN on a connection of its own, ``wake()`` for our queues,
    ``cancelled(id, attempt)`` (in the loop) for each pgq_cancel notification (see Listener)."""

    def __init__(self, dsn: str, queues: Sequence[str] | None, wake: Callable[[], None], worker_name: str,
                 listening: Any, ignores: Callable[[str], bool] | None = None,
                 cancelled: CancelNoticed | None = None) -> None:
        self.dsn = dsn
        self.queues = queues
        self.ignores = ignores  # see Listener
        self.cancelled = cancelled
        self.wake = wake
        self.worker_name = worker_name
        self.listening = listening  # a threading.Event: readable from any thread
        self._stopped = False

    async def run(self) -> None:
        reconnects = Reconnects(self.worker_name)
        while not self._stopped:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.dsn, autocommit=True, connect_timeout=5,
                        application_name=f"pgq-listen {self.worker_name}"[:63], **KEEPALIVES) as conn:
                    if self.cancelled is not None:  # first: the last statement stays LISTEN pgq (listen())
                        await conn.execute(queries.LISTEN_CANCEL)
                    await conn.execute(queries.LISTEN)
                    self.listening.set()
                    self.wake()
                    reconnects.listening()
                    queues, ignores, wake, cancelled = self.queues, self.ignores, self.wake, self.cancelled
                    while not self._stopped:
                        async for notify in conn.notifies(timeout=0.25):
                            heard(notify, queues, ignores, wake, cancelled)
            except psycopg.Error as exc:
                self.listening.clear()
                if self._stopped:
                    break
                await asyncio.sleep(reconnects.broke(exc))
        self.listening.clear()

    def stop(self) -> None:
        self._stopped = True


class HandlerThreads:
    """Up to ``size`` daemon threads that run plain handlers for the loop, as asyncio.to_thread
    would (in a copy of the caller's context). Daemon threads, as Worker's slots: a stop at once
    does not wait for a handler that never returns, and neither does the interpreter's exit."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._calls: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any],
                                             Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def run(self, call: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``call`` in one of the threads; its result (or exception) is the future's."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if len(self._threads) < self.size:
            thread = threading.Thread(target=self._work, name=f"pgq-handler-{len(self._threads) + 1}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._calls.put((loop, future, functools.partial(contextvars.copy_context().run, call)))
        return future

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            loop, future, call = item
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - the handler's outcome, for the loop
                loop.call_soon_threadsafe(_resolve, future, None, exc)
            else:
                loop.call_soon_threadsafe(_resolve, future, result, None)

    def close(self) -> None:
        """Each thread ends after its current handler."""
        for _ in self._threads:
            self._calls.put(None)


def _resolve(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return  # its task was cancelled (a stop at once): nobody waits for this outcome
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class AsyncSlots:
    """Slots for asyncio: ``concurrency`` tasks, each running the held jobs handed to it one at a
    time: an ``async def`` handler is awaited in the task, a plain one runs in a thread of a pool
    of ``concurrency`` threads (never blocking the loop). Also the executor: one handler run,
    one owner call. With ``middleware``, each kind's chain (pgq_thin.worker.middleware) runs
    instead of its handler; the slots are its Bridge (and the pool has a thread per plain run of
    the chain per slot).

    ``interrupt(held)`` cancels the task that runs the async part of a job's chain now (the job
    was cancelled: pgq.cancel); a plain part, in its thread, is told by ctx.cancelled only."""

    def __init__(self, concurrency: int, handlers: Mapping[str, Handler], owner: AsyncOwnerCalls,
                 completer: AsyncCompleter, policy: PrefetchPolicy, flags: Flags, freed: Callable[[], None],
                 middleware: Sequence[Middleware] = ()) -> None:
        self.concurrency = concurrency
        self.handlers = handlers if not middleware else {
            kind: chained_async(handler, middleware, self) for kind, handler in handlers.items()}
        self.owner = owner
        self.completer = completer
        self.policy = policy
        self.flags = flags
        self.freed = freed
        self.assigned = 0
        self.watch: JobWatch | None = None  # metrics and spans; None: neither is on
        # The jobs handed over and not started, and the slots waiting for one (asyncio.Queue's
        # rules, without its five calls per put and per get).
        self._ready: collections.deque[Held] = collections.deque()
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._threads = HandlerThreads(concurrency * threads_per_job(handlers, middleware))
        self._async_kinds: dict[str, bool] = {}  # whether a kind's handler is ``async def`` (asked once)
        # By job id: the task running the job's chain on the loop now, which interrupt() cancels
        # (none while a plain part runs in a thread: that task waits for the thread).
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # (the slots' loop, for from_thread)

    def submit(self, held: Held) -> None:
        self.submit_all([held])

    def submit_all(self, helds: list[Held]) -> None:
        self.assigned += len(helds)
        self._ready.extend(helds)
        idle, wake = self._idle, len(helds)
        while wake and idle:  # one waiting slot per job (a busy slot may take it first: then it
            waiter = idle.popleft()  # looks, finds none, and waits again)
            if not waiter.done():
                waiter.set_result(None)
                wake -= 1

    def take_waiting(self) -> list[Held]:
        waiting = list(self._ready)
        self._ready.clear()
        self.assigned -= len(waiting)
        return waiting

    async def execute(self, held: Held) -> None:
        """Run the handler; record its outcome with exactly one owner call. A cancelled run
        (a stop at once) records nothing: the lease covers the job."""
        watch = self.watch
        if watch is None:
            outcome = await self.outcome(held)
        else:
            token = watch.started(held)
            done: outcomes.Outcome | None = None
            try:
                outcome = done = await self.outcome(held)
            finally:
                watch.finished(token, held, done)
        if held.ctx.completed:  # its ctx.transaction() committed the completion: nothing left to send
            outcomes.committed(outcome, held.log)
            self.owner.held.forget([held])
        elif outcome.batched:
            if not await self.completer.add(held):
                self.owner.held.forget([held])
        else:
            await self.owner.settle(held, outcome)

    async def outcome(self, held: Held) -> outcomes.Outcome:
        """Run the handler: what it returned or raised, as the call that records it."""
        job = held.job
        if log.isEnabledFor(logging.DEBUG):
            held.log.debug("started")
        function = self.handlers.get(job.kind)
        if function is None:
            return outcomes.no_handler(job, self.owner.worker_name, sorted(self.handlers), held.log)
        if isinstance(job.payload, UnreadableJson) or isinstance(job.progress, UnreadableJson):
            refused = outcomes.unreadable(job, held.log)  # (not called per job: the common case is neither)
            if refused is not None:
                return refused
        ctx = held.ctx
        if ctx._cancelled:  # (the attribute, not the property: no call per job)
            return outcomes.cancelled_before_start(held.log)
        try:
            is_async = self._async_kinds.get(job.kind)
            if is_async is None:
                is_async = self._async_kinds[job.kind] = inspect.iscoroutinefunction(function)
            if is_async:
                tasks = self._tasks
                tasks[job.id] = asyncio.current_task()  # type: ignore[assignment]  # (a slot is a task)
                try:
                    result = await function(job, ctx)
                finally:
                    if tasks.pop(job.id, None) is None:  # interrupt() cancelled us meanwhile
                        self._withdraw(ctx)
            else:
                result = await self._call(function, job, ctx)
        except asyncio.CancelledError:
            if not ctx.cancelled or self.flags.done.is_set():
                raise  # a stop at once
            return outcomes.CANCELLED
        except BaseException as exc:  # noqa: BLE001 - any handler failure is an outcome
            return outcomes.CANCELLED if ctx.cancelled else outcomes.of_exception(exc, held.log)
        return outcomes.BATCHED if result is None else outcomes.of_result(result)

    def interrupt(self, held: Held) -> None:
        """The job was cancelled (pgq.cancel): cancel the task running its async part now, if any
        (call in the loop's thread)."""
        task = self._tasks.pop(held.job.id, None)
        if task is not None:
            task.cancel()

    def _withdraw(self, ctx: JobContext) -> None:
        """The slot's task was cancelled by interrupt(), and its handler has ended (raised
        CancelledError, or caught it): withdraw that request (Task.uncancel, Python 3.11+), so that
        the task's next jobs (asyncio.timeout, TaskGroup) do not see it. A stop at once's request,
        or ours when the run is over, stands."""
        task = asyncio.current_task()
        if task is None or not ctx.cancelled or self.flags.done.is_set():
            return
        cancelling, uncancel = getattr(task, "cancelling", None), getattr(task, "uncancel", None)
        if cancelling is not None and uncancel is not None and cancelling():
            uncancel()

    async def in_thread(self, ctx: JobContext, call: Callable[[], Any]) -> Any:
        """Bridge.in_thread: a plain part of a job's chain, from an async one. Not interrupted while
        the thread runs it; once it returns on a cancelled job, the async part gets CancelledError."""
        tasks, job_id = self._tasks, ctx.job.id
        task = tasks.pop(job_id, None)
        try:
            result = await self._threads.run(functools.partial(contextvars.copy_context().run, call))
            return await result if inspect.isawaitable(result) else result
        finally:
            if task is not None:
                if ctx.cancelled:
                    raise asyncio.CancelledError  # the cancel is this part's outcome
                tasks[job_id] = task

    def from_thread(self, ctx: JobContext, call: Callable[[], Awaitable[Any]]) -> Any:
        """Bridge.from_thread: an async part of a job's chain, from a plain one (in a handler
        thread): run on the loop, as a task interrupt() may cancel; its result, or its exception
        (concurrent.futures.CancelledError once cancelled)."""
        loop = self._loop
        assert loop is not None  # a chain runs in a slot: run_slot has set it

        async def part() -> Any:
            if ctx.cancelled:
                raise asyncio.CancelledError
            tasks, job_id = self._tasks, ctx.job.id
            task = tasks[job_id] = asyncio.current_task()  # type: ignore[assignment]
            try:
                return await call()
            finally:
                if tasks.get(job_id) is task:
                    del tasks[job_id]

        return asyncio.run_coroutine_threadsafe(part(), loop).result()

    async def _call(self, function: Handler, job: Job, ctx: JobContext) -> Any:
        """A plain handler, in one of the handler threads."""
        call = functools.partial(function, job, ctx)
        if self.watch is not None:  # the handler's thread sees the attempt's span as current
            call = functools.partial(contextvars.copy_context().run, call)
        result = await self._threads.run(call)
        return await result if inspect.isawaitable(result) else result

    async def run_slot(self) -> None:
        ready, idle, stopping, execute, timed = (self._ready, self._idle, self.flags.stopping, self.execute,
                                                 self.policy.timed)
        monotonic, loop = time.monotonic, asyncio.get_running_loop()
        self._loop = loop
        while True:
            while not ready:
                waiter: asyncio.Future[None] = loop.create_future()
                idle.append(waiter)
                await waiter  # (a cancelled slot leaves a done future behind: submit_all skips it)
            held = ready.popleft()
            started: float | None = None
            try:
                if stopping.is_set():
                    await self.owner.give_back_unstarted(held, "claimed before shutdown, never started")
                else:
                    started = monotonic()
                    await execute(held)
            except asyncio.CancelledError:
                raise
            except BaseException:  # noqa: BLE001 - a slot must survive anything; the lease covers the job
                held.log.exception("the slot failed while running this job")
                self.owner.held.forget([held])
            finally:
                if started is not None:
                    timed(monotonic() - started)
                self.assigned -= 1
                self.freed()

    def close(self) -> None:
        """Let go of the handler threads (one still in a handler finishes on its own)."""
        self._threads.close()


class AsyncClaimer(CarryRules):
    """Claimer for asyncio: the claim loop (see pgq_thin.worker.claimer), carrying the
    completions queued in ``completer`` by the same rules (CarryRules)."""

    def __init__(self, client: AsyncClient, name: str, queues: Sequence[str] | None, lease: Delay | None,
                 timer: PollTimer, policy: PrefetchPolicy, slots: AsyncSlots, held: HeldJobs,
                 owner: AsyncOwnerCalls, clock: DatabaseClock, flags: Flags, listening: Any,
                 wake: asyncio.Event, kinds: Sequence[str] | None = None,
                 completer: AsyncCompleter | None = None) -> None:
        self.client = client
        self.name = name
        self.queues = queues
        self.kinds = kinds  # claim only these (the worker's handlers); None: any kind
        self.lease = lease
        self.timer = timer
        self.policy = policy
        self.slots = slots
        self.held = held
        self.owner = owner
        self.clock = clock
        self.flags = flags
        self.listening = listening
        self.completer = completer  # whose completions our claims carry (Claimer.completer)
        self.combined = True  # False once the database turned out to have no pgq.complete_and_claim
        self._wake = wake
        self._own = False  # whether the wake-up is our own (Claimer.ours)

    metrics: WorkerMetrics | None = None  # set by the worker when metrics are on
    completer: AsyncCompleter | None

    def wake(self) -> None:
        """Look again at once (call in the loop's thread)."""
        self._wake.set()

    def ours(self) -> None:
        """A wake-up of our own, never held back by the WakeLimit (Claimer.ours)."""
        self._own = True
        self._wake.set()

    async def run(self) -> None:
        timer, policy, slots = self.timer, self.policy, self.slots
        timer.pace.learned(await self.rate_waits())
        try:
            while not self.flags.stopping.is_set():
                if timer.sweep_due():
                    self.carry(False)
                    await self.sweep()
                    timer.swept()
                    continue
                batch = policy.claim_size(slots.assigned)
                if batch == 0:
                    await self.sleep(timer.poll_interval, carry=self.carries(policy.claim_size(slots.assigned - 1)))
                    continue
                self.carry(self.carries(batch))
                # What wakes us from now on is news to this claim (a wake-up set before it, by a
                # slot whose completion it carries, say, would only make an empty claim after it).
                self._own = False
                self._wake.clear()
                try:
                    jobs = await self.claim(batch)
                except PgqError as exc:
                    self.carry(False)
                    delay = timer.claim_failed(exc, self.name)
                    await self.owner.drop_broken_connections()
                    await self.sleep(delay)
                    continue
                if self.metrics is not None:
                    self.metrics.claimed(len(jobs))
                if jobs:
                    await self.hand_over_all(jobs)
                policy.claimed(len(jobs), batch)
                wait = timer.claimed(len(jobs), batch, self.name, self.listening.is_set(), again=self.carrying())
                quiet = False
                if timer.pace.wanted(len(jobs), batch):
                    wait, quiet = timer.pace.paced(await self.rate_waits(), wait)
                if wait:
                    await self.sleep(wait, limited=True, quiet=quiet,
                                     carry=not quiet and self.carries(policy.claim_size(slots.assigned - 1)))
        finally:
            self.carry(False)

    async def claim(self, batch: int) -> list[Job]:
        """Claim up to ``batch`` jobs, carrying the completions queued (Claimer.claim)."""
        if self.kinds == []:  # no handler: nothing here could run a job
            return []
        completer = self.completer
        carried = completer.take(CARRY_MAX) if completer is not None and self.carries(batch) else []
        if completer is None or not carried:
            return await self.client.claim(self.name, self.queues, batch=batch, lease=self.lease, kinds=self.kinds)
        try:
            answer = await self.client.complete_and_claim(
                [h.job.id for h in carried], [h.job.attempt for h in carried], self.name, self.queues,
                batch=batch, lease=self.lease, kinds=self.kinds)
        except BaseException as exc:
            completer.give_back(carried)
            if not (isinstance(exc, PgqError) and exc.sqlstate == UNDEFINED_FUNCTION):
                raise
            log.warning("this database has no pgq.complete_and_claim (its pgq schema is older than this "
                        "pgq-thin: run `pgq-thin migrate`); completions are sent apart from the claims",
                        extra={"worker": self.name})
            self.combined = False
            completer.carry(False)
            return await self.client.claim(self.name, self.queues, batch=batch, lease=self.lease, kinds=self.kinds)
        completer.settled(carried, answer.completed)
        return answer.jobs

    async def rate_waits(self) -> Mapping[str, timedelta]:
        """pgq.rate_limit_wait for our queues ({} when it fails; Claimer.rate_waits)."""
        try:
            return await self.client.rate_limit_wait(self.queues)
        except PgqError as exc:
            log.debug("could not read the rate limits (%s)", exc, extra={"worker": self.name})
            return {}

    async def sleep(self, seconds: float, limited: bool = False, quiet: bool = False, carry: bool = False) -> None:
        """Wait until woken, ``seconds`` pass or the next sweep is due; the wake-up is cleared
        before the next claim. ``limited``: a wake-up is held as the WakeLimit says; ``quiet``:
        only a stop wakes us sooner; ``carry``: the completions queued meanwhile wait for the
        claim a freed slot starts (Claimer.sleep)."""
        self.carry(carry)
        if quiet:
            deadline = time.monotonic() + self.timer.until(seconds)
            while not self.flags.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.05))
            self._wake.clear()
            return
        if not self._wake.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), self.timer.until(seconds))
            except TimeoutError:
                pass
        if self._wake.is_set() and limited and not self._own and (hold := self.timer.wakes.held()):
            self.carry(False)
            await asyncio.sleep(hold)
        self._own = False
        self._wake.clear()

    async def hand_over(self, job: Job) -> None:
        await self.hand_over_all([job])

    async def hand_over_all(self, jobs: list[Job]) -> None:
        """Hold the jobs of one claim and hand them to the slots, or give them back if we are
        stopping (Claimer.hand_over_all)."""
        stopping = self.flags.stopping
        if stopping.is_set():
            for job in jobs:
                await self.owner.give_back(job, "claimed during shutdown, never started")
            return
        client, name, clock = self.client, self.name, self.clock
        contexts = [JobContext(job, client, name, stopping,
                               deadline_monotonic=None if job.deadline is None else clock.monotonic_of(job.deadline))
                    for job in jobs]
        self.slots.submit_all(self.held.hold_all(jobs, contexts, clock.leases_of(jobs, self.lease)))

    async def sweep(self) -> None:
        try:
            recovered = await self.client.sweep()
        except PgqError as exc:
            log.warning("sweep failed: %s", exc, extra={"worker": self.name})
            return
        if recovered:
            log.info("sweep recovered %d jobs with expired leases", recovered,
                     extra={"worker": self.name, "recovered": recovered})
        await read_clock(self.clock, self.client)
        self.timer.pace.learned(await self.rate_waits())
