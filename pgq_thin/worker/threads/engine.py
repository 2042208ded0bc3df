# Generated from pgq_thin/worker/engine.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's Run: made of the asyncio AsyncRun
(pgq_thin.worker.engine), blocking a thread instead of awaiting."""

from __future__ import annotations

import time

from psycopg_pool import ConnectionPool

from pgq_thin.client import Client
from pgq_thin.errors import PgqError
from pgq_thin.worker.base import WorkerBase
from pgq_thin.worker.claimer import ClaimNudge, PollTimer
from pgq_thin.worker.held import HeldJobs, Verdict
from pgq_thin.worker.middleware import chained
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock
from pgq_thin.worker.support import log
from pgq_thin.worker.threads.claimer import Claimer
from pgq_thin.worker.threads.completer import Completer
from pgq_thin.worker.threads.executor import Executor
from pgq_thin.worker.threads.heartbeat import Heartbeat
from pgq_thin.worker.threads.listener import Listener
from pgq_thin.worker.threads.owner import OwnerCalls
from pgq_thin.worker.threads.renewer import Renewer, read_clock
from pgq_thin.worker.threads.slots import Slots
from pgq_thin.worker.threads.waits import Wakeup, nap

__all__ = ["Run"]


class Run:
    """One run of ``worker`` on ``dsn``: ``work()`` until a stop; ``nudge`` (once the parts are
    built) wakes the claim loop, which stop() does."""

    def __init__(self, worker: WorkerBase, dsn: str) -> None:
        self.worker = worker
        self.dsn = dsn
        self.nudge: ClaimNudge[Wakeup] | None = None

    def work(self) -> None:
        worker, flags = self.worker, self.worker._flags
        pool = ConnectionPool(
            self.dsn, min_size=1,
            max_size=worker.concurrency + 4,  # the slots, the claimer, the completer, the renewer, the heartbeat
            kwargs=worker.connection_settings(),
            # Each of our parts can always have a connection (max_size), so a call that waits this
            # long means the server is unreachable: it raises ConnectionLost and we back off.
            timeout=2.0, name=f"pgq-worker {worker.name}", open=False)
        pool.open()
        client = Client(pool=pool, pooled=worker.pooled)
        client.keyring = worker.keyring  # the worker's keys, checked when it was made
        clock = DatabaseClock()
        try:
            read_clock(clock, client)
            try:
                worker._warn_about_queues(client.queue_status(worker.queues) if worker.queues else [])
            except PgqError as exc:  # a login without pgq_worker's grant, a lost connection: not fatal here
                worker._queues_not_checked(exc)
            watch = worker._watch()
        except BaseException:
            pool.close(timeout=1.0)
            raise
        metrics = worker.metrics
        handlers = {kind: chained(h, worker._middleware) for kind, h in worker._handlers.items()}
        held = HeldJobs(on_lost=None if metrics is None else metrics.lease_lost)
        policy = PrefetchPolicy(worker.prefetch, worker.concurrency)
        timer = PollTimer(worker.poll_interval, worker.sweep_interval, worker.queues)
        self.nudge = nudge = ClaimNudge(timer, Wakeup())
        owner = OwnerCalls(client, held, flags, worker.name)
        completer = Completer(owner, held, flags, nudge)
        executor = Executor(handlers, owner, completer, flags,
                                 watch)
        slots = Slots(worker.concurrency, executor, owner, policy, flags, freed=completer.freed)
        renewer = Renewer(client, held, clock, flags, worker.lease)
        heartbeat = Heartbeat(client, worker.name, worker.queues, worker.kinds, held, flags,
                                   worker.heartbeat_interval)
        claimer = Claimer(client, worker.name, worker.queues, worker.lease, timer, nudge, policy, slots, held,
                               owner, completer, clock, flags, worker._listening, kinds=worker.kinds,
                               metrics=metrics)
        listener = Listener(self.dsn, worker.queues, nudge.wake, worker.name, worker._listening,
                                 ignores=timer.pace.ignores, cancelled=renewer.cancel_noticed)
        if flags.stopping.is_set():
            nudge.wake()
        background = [renewer, completer, heartbeat, *([listener] if worker.listen else [])]
        heartbeat.announce()
        slots.start()
        for part in background:
            part.start()
        worker._started()
        try:
            claimer.run()
        finally:
            listener.stop()
            self.shutdown(slots, held, owner, completer)
            flags.done.set()
            slots.stop()
            renewer.stop()
            completer.stop()
            heartbeat.stop()
            if not flags.hard_stop.is_set():
                heartbeat.farewell()
            if not flags.hard_stop.is_set():
                for part in background:
                    part.join(timeout=5.0)
            # A slot still in an async handler is cancelled (asyncio); one in a thread finishes on
            # its own. Either way its job is ours no longer: the release above, or the lease, covers it.
            slots.cancel()
            for part in background:
                part.cancel()
            pool.close(timeout=1.0)
            worker._unwatch()
            log.info("worker %s stopped", worker.name, extra={"worker": worker.name})

    def shutdown(self, slots: Slots, held: HeldJobs, owner: OwnerCalls,
                       completer: Completer) -> None:
        """Give back the jobs no slot started; wait up to shutdown_timeout for running jobs,
        recording their completions as they come; give back those still running. After a hard
        stop: one quick try to record the completions queued, or their leases cover them."""
        worker = self.worker
        hard_stop = worker._flags.hard_stop
        if hard_stop.is_set():
            completer.try_flush()
            return
        for waiting in slots.take_waiting():
            owner.give_back_unstarted(waiting, "claimed before shutdown, never started")
        deadline = time.monotonic() + worker.shutdown_timeout
        if held:
            log.info("waiting up to %.0fs for %d running jobs", worker.shutdown_timeout, len(held),
                     extra={"worker": worker.name})
        while held and time.monotonic() < deadline:
            completer.try_flush()
            nap(0.05, worker._flags)
            if hard_stop.is_set():
                completer.try_flush()
                return
        completer.try_flush()
        for left in held.jobs():
            verdict = held.take_over(left)
            if verdict is Verdict.BUSY:
                left.log.warning("still renewing its lease at exit; its lease covers it")
            elif verdict is Verdict.GRANTED:
                owner.give_back(left.job, f"still running after shutdown_timeout ({worker.shutdown_timeout}s)")
