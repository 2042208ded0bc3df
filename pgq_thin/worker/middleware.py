"""Middleware and lifecycle hooks. ``worker.middleware(fn)`` wraps every handler: ``fn(job, ctx,
call_next)`` runs around it, ``call_next()`` runs the rest of the chain (the next middleware, at
the end the handler) and returns its result; what ``fn`` returns is the handler's result, what it
raises the job's outcome, as a handler's would be. The first registered is the outermost.
``worker.on_start(fn)`` and ``worker.on_stop(fn)`` run ``fn()`` once per run.

The chain is composed once per kind when a run starts (``chained``, ``chained_async``): a worker
without middleware runs its handlers as they are, with no call added per job.

On an AsyncWorker each part of the chain runs as a handler would: an ``async def`` one in the
slot's task (``call_next()`` returns an awaitable), a plain one in a handler thread
(``call_next()`` returns the result). Where the chain passes from one to the other, a ``Bridge``
(the AsyncWorker's slots) runs the next part in a thread, or on the loop from a thread.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from pgq_thin.models import Job
from pgq_thin.worker.context import Handler, JobContext

__all__ = ["Bridge", "Hook", "Middleware", "chained", "chained_async", "check_registration", "threads_per_job"]

#: A middleware: called with the job, its context and ``call_next``.
Middleware = Callable[[Job, JobContext, Callable[[], Any]], Any]
#: An on_start / on_stop hook: called with no arguments.
Hook = Callable[[], Any]


def check_registration(what: str, function: Any, worker: str, started: bool, allow_async: bool) -> None:
    """Refuse what cannot be registered: a worker that has started (the chain and the hooks are
    fixed when a run starts), something that is not callable, an ``async def`` on a Worker (its
    threads would only make a coroutine that nobody awaits)."""
    if started:
        raise RuntimeError(f"{what} must be registered before run(): this {worker} has started")
    if not callable(function):
        raise TypeError(f"{what} takes a function, got {type(function).__name__}")
    if not allow_async and inspect.iscoroutinefunction(function):
        raise TypeError(f"{what}: {getattr(function, '__name__', function)!r} is an async def, which a {worker} "
                        "cannot run (its handlers run in threads): use a plain function, or an AsyncWorker")


def chained(handler: Handler, middleware: Sequence[Middleware]) -> Handler:
    """``handler`` wrapped by ``middleware`` (the first outermost), for a Worker: plain functions
    called in the slot's thread."""
    for layer in reversed(middleware):
        handler = _wrapped(layer, handler)
    return handler


def _wrapped(layer: Middleware, inner: Handler) -> Handler:
    def wrapped(job: Job, ctx: JobContext) -> Any:
        return layer(job, ctx, functools.partial(inner, job, ctx))

    return wrapped


class Bridge(Protocol):
    """How an AsyncWorker's chain passes between the loop and its handler threads."""

    def in_thread(self, ctx: JobContext, call: Callable[[], Any]) -> Awaitable[Any]:
        """Run a plain part of the chain in a handler thread (from the loop)."""

    def from_thread(self, ctx: JobContext, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run an async part of the chain on the loop and wait for it (from a handler thread)."""


def chained_async(handler: Handler, middleware: Sequence[Middleware], bridge: Bridge) -> Handler:
    """``handler`` wrapped by ``middleware`` (the first outermost), for an AsyncWorker: the chain
    is an ``async def`` when its outermost part is one (the slot awaits it), else a plain function
    (run in a handler thread)."""
    for layer in reversed(middleware):
        handler = _wrapped_async(layer, handler, bridge)
    return handler


def _wrapped_async(layer: Middleware, inner: Handler, bridge: Bridge) -> Handler:
    inner_async = inspect.iscoroutinefunction(inner)
    if inspect.iscoroutinefunction(layer):
        if inner_async:
            async def on_loop(job: Job, ctx: JobContext) -> Any:
                return await layer(job, ctx, functools.partial(inner, job, ctx))
        else:
            async def on_loop(job: Job, ctx: JobContext) -> Any:
                call = functools.partial(inner, job, ctx)
                return await layer(job, ctx, functools.partial(bridge.in_thread, ctx, call))
        return on_loop
    if inner_async:
        def in_thread(job: Job, ctx: JobContext) -> Any:
            return layer(job, ctx, functools.partial(bridge.from_thread, ctx, functools.partial(inner, job, ctx)))
        return in_thread
    return _wrapped(layer, inner)


def threads_per_job(handlers: Mapping[str, Handler], middleware: Sequence[Middleware]) -> int:
    """The most handler threads one job's chain holds at once on an AsyncWorker: one per run of
    plain parts in it (a plain middleware waiting for an async part that waits for a plain one
    holds two), at least one."""
    most = 1
    for handler in handlers.values():
        parts = [inspect.iscoroutinefunction(f) for f in (*middleware, handler)]
        runs = sum(1 for i, is_async in enumerate(parts) if not is_async and (i == 0 or parts[i - 1]))
        most = max(most, runs)
    return most
