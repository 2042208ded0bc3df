"""How the asyncio runtime runs a job's chain: an ``async def`` part as the slot's task, a plain
one in a handler thread (never blocking the loop), and where a chain of middleware passes from
one to the other (the Bridge of pgq_thin.worker.middleware). A cancel (pgq.cancel) cancels the
task that runs a job's async part now (``interrupt``). The thread runtime calls its handlers in
its slots' threads and has no twin of this file."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from pgq_thin.models import Job
from pgq_thin.worker.context import Handler, JobContext
from pgq_thin.worker.held import Held
from pgq_thin.worker.support import Flags

__all__ = ["HandlerThreads", "TaskBridge"]


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


class TaskBridge:
    """Runs the chains of ``handlers`` for the asyncio slots: ``call()`` one (awaited in the slot's
    task, or in one of ``threads`` handler threads), ``interrupt(held)`` the one of a cancelled
    job, and the Bridge a chain of middleware uses (``in_thread``, ``from_thread``)."""

    def __init__(self, threads: int, flags: Flags) -> None:
        self.flags = flags
        self._threads = HandlerThreads(threads)
        self._async_kinds: dict[Handler, bool] = {}  # whether a handler is ``async def`` (asked once)
        # By job id: the task running the job's chain on the loop now, which interrupt() cancels
        # (none while a plain part runs in a thread: that task waits for the thread).
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # (the slots' loop, for from_thread)

    async def call(self, function: Handler, job: Job, ctx: JobContext, watched: bool) -> Any:
        """Run ``function`` (a handler or its chain) on the job: awaited here when it is an
        ``async def``, else in a handler thread (in a copy of this context when ``watched``: the
        attempt's span is current there)."""
        self._loop = asyncio.get_running_loop()
        is_async = self._async_kinds.get(function)
        if is_async is None:
            is_async = self._async_kinds[function] = inspect.iscoroutinefunction(function)
        if not is_async:
            call = functools.partial(function, job, ctx)
            if watched:
                call = functools.partial(contextvars.copy_context().run, call)
            result = await self._threads.run(call)
            return await result if inspect.isawaitable(result) else result
        tasks = self._tasks
        tasks[job.id] = asyncio.current_task()  # type: ignore[assignment]  # (a slot is a task)
        try:
            return await function(job, ctx)
        finally:
            if tasks.pop(job.id, None) is None:  # interrupt() cancelled us meanwhile
                self._withdraw(ctx)

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
        assert loop is not None  # a chain runs in a slot: call() has set it

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

    def close(self) -> None:
        """Let go of the handler threads (one still in a handler finishes on its own)."""
        self._threads.close()
