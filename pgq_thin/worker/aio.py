"""AsyncWorker: the asyncio runtime. It only wires the parts together (aio_parts.py, and the
registry, the prefetch policy, the outcomes and the signal rule the thread runtime uses too)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Sequence

from psycopg_pool import AsyncConnectionPool

from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PgqError
from pgq_thin.worker.aio_parts import (
    AsyncClaimer,
    AsyncCompleter,
    AsyncListener,
    AsyncOwnerCalls,
    AsyncRenewer,
    AsyncSlots,
    nap,
    read_clock,
)
from pgq_thin.worker.base import WorkerBase
from pgq_thin.worker.claimer import PollTimer
from pgq_thin.worker.held import HeldJobs, Verdict
from pgq_thin.worker.middleware import Hook
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock
from pgq_thin.worker.signals import Signals
from pgq_thin.worker.support import log

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
    asyncio.to_thread would), so that it never blocks the loop. ``ctx.client`` is an AsyncClient.

        worker = AsyncWorker(queues=["default"], concurrency=20)

        @worker.handler("send_email")
        async def send_email(job, ctx):
            ...

        await worker.run()       # until SIGTERM / SIGINT or worker.stop()
    """

    _loop: asyncio.AbstractEventLoop | None = None
    _claimer: AsyncClaimer | None = None

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
        claimer, loop = self._claimer, self._loop
        if claimer is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(claimer.wake)

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
        flags = self._flags
        pool = AsyncConnectionPool(
            dsn, min_size=1, max_size=self.concurrency + 3,
            kwargs=self.connection_settings(),
            timeout=2.0, name=f"pgq-worker {self.name}", open=False)
        await pool.open()
        client = AsyncClient(pool=pool, pooled=self.pooled)
        held, clock = HeldJobs(), DatabaseClock()
        try:
            await read_clock(clock, client)
            try:
                self._warn_about_queues(await client.queue_status(self.queues) if self.queues else [])
            except PgqError as exc:
                self._queues_not_checked(exc)
            watch = self._watch(held)
        except BaseException:
            await pool.close(timeout=1.0)
            raise
        policy = PrefetchPolicy(self.prefetch, self.concurrency)
        owner = AsyncOwnerCalls(client, held, flags, self.name)
        # (The claimer, made below, is told when a slot frees and when completions commit; its
        # claims carry the completions queued.)
        completer = AsyncCompleter(owner, held, flags, recorded=lambda: claimer.recorded())
        wake = asyncio.Event()  # the claimer's: set when a slot frees, a NOTIFY comes, stop()
        slots = AsyncSlots(self.concurrency, self._handlers, owner, completer, policy, flags,
                           freed=lambda: claimer.freed(), middleware=self._middleware)
        slots.watch = watch
        renewer = AsyncRenewer(client, held, clock, flags, self.lease)
        held.on_cancelled = slots.interrupt  # (called by the renewer, in the loop)

        def cancel_noticed(job_id: int, attempt: int) -> None:  # a pgq_cancel notification: renew it now
            if held.notice_cancel(job_id, attempt):
                renewer.wake()

        timer = PollTimer(self.poll_interval, self.sweep_interval, self.queues)
        self._claimer = claimer = AsyncClaimer(
            client, self.name, self.queues, self.lease, timer,
            policy, slots, held, owner, clock, flags, self._listening, wake, kinds=self.kinds, completer=completer)
        slots.freed = claimer.freed  # (the same, without the lambda's call per job)
        claimer.metrics = self.metrics
        listener = AsyncListener(dsn, self.queues, claimer.wake, self.name, self._listening,
                                 ignores=timer.pace.ignores, cancelled=cancel_noticed)
        if flags.stopping.is_set():
            claimer.wake()
        slot_tasks = [asyncio.create_task(slots.run_slot(), name=f"pgq-slot-{n}")
                      for n in range(1, self.concurrency + 1)]
        background = [asyncio.create_task(renewer.run(), name="pgq-renew"),
                      asyncio.create_task(completer.run(), name="pgq-complete")]
        listening = asyncio.create_task(listener.run(), name="pgq-listen") if self.listen else None
        self._started()
        try:
            await claimer.run()
        finally:
            listener.stop()
            await self._shutdown(slots, held, owner, completer)
            flags.done.set()
            renewer.stop()
            completer.stop()
            # A slot still in an async handler is cancelled; one in a thread finishes on its own.
            # Either way its job is ours no longer: the release above, or the lease, covers it.
            for task in slot_tasks:
                task.cancel()
            if listening is not None:
                listening.cancel()
            if not flags.hard_stop.is_set():
                await asyncio.wait(background, timeout=5.0)
            for task in background:
                task.cancel()
            await asyncio.gather(*slot_tasks, *background, *([listening] if listening else []),
                                 return_exceptions=True)
            slots.close()
            await pool.close(timeout=1.0)
            self._unwatch()
            self._claimer = None
            log.info("worker %s stopped", self.name, extra={"worker": self.name})

    async def _shutdown(self, slots: AsyncSlots, held: HeldJobs, owner: AsyncOwnerCalls,
                        completer: AsyncCompleter) -> None:
        """As Worker's: give back what no slot started, wait up to shutdown_timeout recording
        completions, give back what still runs; after a hard stop, one quick try to record."""
        hard_stop = self._flags.hard_stop
        if hard_stop.is_set():
            await completer.try_flush()
            return
        for waiting in slots.take_waiting():
            await owner.give_back_unstarted(waiting, "claimed before shutdown, never started")
        deadline = time.monotonic() + self.shutdown_timeout
        if held:
            log.info("waiting up to %.0fs for %d running jobs", self.shutdown_timeout, len(held),
                     extra={"worker": self.name})
        while held and time.monotonic() < deadline:
            await completer.try_flush()
            await nap(0.05, self._flags)
            if hard_stop.is_set():
                await completer.try_flush()
                return
        await completer.try_flush()
        for left in held.jobs():
            verdict = held.take_over(left)
            if verdict is Verdict.BUSY:
                left.log.warning("still renewing its lease at exit; its lease covers it")
            elif verdict is Verdict.GRANTED:
                await owner.give_back(left.job, f"still running after shutdown_timeout ({self.shutdown_timeout}s)")
