"""One run of a worker: the parts built in dependency order, each taking its collaborators in its
constructor, started, and the shutdown. Written once, for asyncio (AsyncRun, which AsyncWorker
awaits); the thread runtime's Run (Worker) is generated from it (pgq_thin/worker/threads/engine.py).

The order: the pool and the client; the database clock and the queues' check; the metrics and
spans (``watch``); the registry of held jobs (told when a lease is lost, or a job cancelled); the
poll timer and the claimer's nudge (what wakes the claim loop); the owner calls; the completer
(it nudges the claimer); the executor and the slots (a freed slot tells the completer); the
renewer; the claimer; the listener (it wakes the claimer, and hands cancels to the registry)."""

from __future__ import annotations

import time

from psycopg_pool import AsyncConnectionPool

from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PgqError
from pgq_thin.worker.base import WorkerBase
from pgq_thin.worker.bridge import TaskBridge
from pgq_thin.worker.claimer import AsyncClaimer, ClaimNudge, PollTimer
from pgq_thin.worker.completer import AsyncCompleter
from pgq_thin.worker.executor import AsyncExecutor
from pgq_thin.worker.heartbeat import AsyncHeartbeat
from pgq_thin.worker.held import HeldJobs, Verdict
from pgq_thin.worker.listener import AsyncListener
from pgq_thin.worker.middleware import chained, chained_async, threads_per_job
from pgq_thin.worker.owner import AsyncOwnerCalls
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import AsyncRenewer, DatabaseClock, read_clock
from pgq_thin.worker.slots import AsyncSlots
from pgq_thin.worker.support import log
from pgq_thin.worker.waits import ASYNC, Wakeup, nap

__all__ = ["AsyncRun"]


class AsyncRun:
    """One run of ``worker`` on ``dsn``: ``work()`` until a stop; ``nudge`` (once the parts are
    built) wakes the claim loop, which stop() does."""

    def __init__(self, worker: WorkerBase, dsn: str) -> None:
        self.worker = worker
        self.dsn = dsn
        self.nudge: ClaimNudge[Wakeup] | None = None

    async def work(self) -> None:
        worker, flags = self.worker, self.worker._flags
        pool = AsyncConnectionPool(
            self.dsn, min_size=1,
            max_size=worker.concurrency + 4,  # the slots, the claimer, the completer, the renewer, the heartbeat
            kwargs=worker.connection_settings(),
            # Each of our parts can always have a connection (max_size), so a call that waits this
            # long means the server is unreachable: it raises ConnectionLost and we back off.
            timeout=2.0, name=f"pgq-worker {worker.name}", open=False)
        await pool.open()
        client = AsyncClient(pool=pool, pooled=worker.pooled)
        client.keyring = worker.keyring  # the worker's keys, checked when it was made
        clock = DatabaseClock()
        try:
            await read_clock(clock, client)
            try:
                worker._warn_about_queues(await client.queue_status(worker.queues) if worker.queues else [])
            except PgqError as exc:  # a login without pgq_worker's grant, a lost connection: not fatal here
                worker._queues_not_checked(exc)
            watch = worker._watch()
        except BaseException:
            await pool.close(timeout=1.0)
            raise
        metrics = worker.metrics
        if ASYNC:
            bridge = TaskBridge(worker.concurrency * threads_per_job(worker._handlers, worker._middleware), flags)
            handlers = {kind: chained_async(h, worker._middleware, bridge) for kind, h in worker._handlers.items()}
            held = HeldJobs(on_lost=None if metrics is None else metrics.lease_lost, on_cancelled=bridge.interrupt)
        else:
            handlers = {kind: chained(h, worker._middleware) for kind, h in worker._handlers.items()}
            held = HeldJobs(on_lost=None if metrics is None else metrics.lease_lost)
        policy = PrefetchPolicy(worker.prefetch, worker.concurrency)
        timer = PollTimer(worker.poll_interval, worker.sweep_interval, worker.queues)
        self.nudge = nudge = ClaimNudge(timer, Wakeup())
        owner = AsyncOwnerCalls(client, held, flags, worker.name)
        completer = AsyncCompleter(owner, held, flags, nudge)
        executor = AsyncExecutor(handlers, owner, completer, flags,
                                 bridge,  # ASYNC
                                 watch)
        slots = AsyncSlots(worker.concurrency, executor, owner, policy, flags, freed=completer.freed)
        renewer = AsyncRenewer(client, held, clock, flags, worker.lease)
        heartbeat = AsyncHeartbeat(client, worker.name, worker.queues, worker.kinds, held, flags,
                                   worker.heartbeat_interval)
        claimer = AsyncClaimer(client, worker.name, worker.queues, worker.lease, timer, nudge, policy, slots, held,
                               owner, completer, clock, flags, worker._listening, kinds=worker.kinds,
                               metrics=metrics)
        listener = AsyncListener(self.dsn, worker.queues, nudge.wake, worker.name, worker._listening,
                                 ignores=timer.pace.ignores, cancelled=renewer.cancel_noticed)
        if flags.stopping.is_set():
            nudge.wake()
        background = [renewer, completer, heartbeat, *([listener] if worker.listen else [])]
        await heartbeat.announce()
        slots.start()
        for part in background:
            part.start()
        worker._started()
        try:
            await claimer.run()
        finally:
            listener.stop()
            await self.shutdown(slots, held, owner, completer)
            flags.done.set()
            slots.stop()
            renewer.stop()
            completer.stop()
            heartbeat.stop()
            if not flags.hard_stop.is_set():
                await heartbeat.farewell()
            if not flags.hard_stop.is_set():
                for part in background:
                    await part.join(timeout=5.0)
            # A slot still in an async handler is cancelled (asyncio); one in a thread finishes on
            # its own. Either way its job is ours no longer: the release above, or the lease, covers it.
            slots.cancel()
            for part in background:
                part.cancel()
            if ASYNC:
                await slots.join()
                for part in background:
                    await part.join()
                bridge.close()
            await pool.close(timeout=1.0)
            worker._unwatch()
            log.info("worker %s stopped", worker.name, extra={"worker": worker.name})

    async def shutdown(self, slots: AsyncSlots, held: HeldJobs, owner: AsyncOwnerCalls,
                       completer: AsyncCompleter) -> None:
        """Give back the jobs no slot started; wait up to shutdown_timeout for running jobs,
        recording their completions as they come; give back those still running. After a hard
        stop: one quick try to record the completions queued, or their leases cover them."""
        worker = self.worker
        hard_stop = worker._flags.hard_stop
        if hard_stop.is_set():
            await completer.try_flush()
            return
        for waiting in slots.take_waiting():
            await owner.give_back_unstarted(waiting, "claimed before shutdown, never started")
        deadline = time.monotonic() + worker.shutdown_timeout
        if held:
            log.info("waiting up to %.0fs for %d running jobs", worker.shutdown_timeout, len(held),
                     extra={"worker": worker.name})
        while held and time.monotonic() < deadline:
            await completer.try_flush()
            await nap(0.05, worker._flags)
            if hard_stop.is_set():
                await completer.try_flush()
                return
        await completer.try_flush()
        for left in held.jobs():
            verdict = held.take_over(left)
            if verdict is Verdict.BUSY:
                left.log.warning("still renewing its lease at exit; its lease covers it")
            elif verdict is Verdict.GRANTED:
                await owner.give_back(left.job, f"still running after shutdown_timeout ({worker.shutdown_timeout}s)")
