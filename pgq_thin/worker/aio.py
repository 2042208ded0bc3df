"""AsyncWorker: the asyncio runtime. Its run is pgq_thin.worker.engine's AsyncRun, which builds the
parts (each written once, for asyncio; the thread runtime's are generated from them)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence

from pgq_thin.worker.base import WorkerBase
from pgq_thin.worker.engine import AsyncRun
from pgq_thin.worker.middleware import Hook
from pgq_thin.worker.signals import Signals

__all__ = ["AsyncWorker"]


async def _called(hook: Hook) -> None:
    """Run an on_start / on_stop hook: awaited when it is an ``async def``, else in a thread."""
    if inspect.iscoroutinefunction(hook):
        await hook()
    else:
        result = await asyncio.to_thread(hook)
        if inspect.isawaitable(result):
            await result


class AsyncWorker(WorkerBase):
    """Runs handlers for the jobs of ``queues`` as asyncio tasks, ``concurrency`` at once; the
    settings are Worker's, and so are the semantics (batched completions, lease renewal, LISTEN
    with polling as the fallback, prefetch, graceful shutdown, reconnecting). An ``async def``
    handler runs in its task; a plain one in a thread (a pool of ``concurrency`` threads, as
    asyncio.to_thread would), so that it never blocks the loop. ``ctx.client`` is an AsyncClient
    (with the worker's key ring, when ``keys`` and ``encrypt_with`` are given: docs/encryption.md).

        worker = AsyncWorker(queues=["default"], concurrency=20)

        @worker.handler("send_email")
        async def send_email(job, ctx):
            ...

        await worker.run()       # until SIGTERM / SIGINT or worker.stop()
    """

    _loop: asyncio.AbstractEventLoop | None = None
    _run: AsyncRun | None = None  # while run() runs

    async def run(
        self,
        dsn: str | None = None,
        *,
        queues: Sequence[str] | str | None = None,
        concurrency: int | None = None,
        prefetch: int | str | None = None,
        install_signal_handlers: bool = True,
        pooled: bool | None = None,
    ) -> None:
        """Work until stop() or SIGTERM / SIGINT (the second one: stop at once), as Worker.run."""
        address = self._begin(dsn, queues, concurrency, prefetch, pooled)
        self._loop = asyncio.get_running_loop()
        signals = Signals(lambda graceful: self.stop(graceful=graceful), self._flags.stopping.is_set, self.name)
        if install_signal_handlers:
            signals.install_on(self._loop)
        try:
            await self._serve(address)
        finally:
            signals.restore()

    def stop(self, graceful: bool = True) -> None:
        """Stop claiming and shut down; from any thread. ``graceful=False``: run() returns at
        once, running jobs are left to their leases (their handler tasks are cancelled)."""
        self._flags.stopping.set()
        if not graceful:
            self._flags.hard_stop.set()
        run, loop = self._run, self._loop
        if run is not None and run.nudge is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(run.nudge.wake)

    _async_parts = True  # async def middleware and hooks

    async def _serve(self, dsn: str) -> None:
        """The run between its hooks: on_start, the work, on_stop."""
        for hook in self._on_start:
            await _called(hook)
        try:
            await self._work(dsn)
        except BaseException:
            await self._stop_hooks(raising=False)
            raise
        await self._stop_hooks(raising=True)

    async def _stop_hooks(self, raising: bool) -> None:
        first: BaseException | None = None
        for hook in self._on_stop:
            try:
                await _called(hook)
            except BaseException as exc:  # noqa: BLE001 - every hook runs; the first is raised
                self._stop_hook_failed(hook, exc)
                first = first or exc
        if first is not None and raising:
            raise first

    async def _work(self, dsn: str) -> None:
        self._run = AsyncRun(self, dsn)
        try:
            await self._run.work()
        finally:
            self._run = None
