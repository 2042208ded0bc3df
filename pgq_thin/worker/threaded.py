"""Worker: the thread runtime. It only wires the parts together; each part is a module of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from psycopg_pool import ConnectionPool

from pgq_thin.client import Client
from pgq_thin.worker.base import WorkerBase
from pgq_thin.worker.claimer import Claimer, PollTimer
from pgq_thin.worker.completer import Completer
from pgq_thin.worker.executor import Executor
from pgq_thin.worker.held import HeldJobs, Verdict
from pgq_thin.worker.listener import Listener
from pgq_thin.worker.middleware import chained
from pgq_thin.worker.owner import OwnerCalls
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock, Renewer
from pgq_thin.worker.signals import Signals
from pgq_thin.worker.slots import Slots
from pgq_thin.worker.support import Part, log

__all__ = ["Worker"]


class Worker(WorkerBase):
    """Runs handlers for the jobs of ``queues`` in ``concurrency`` threads. Connects to nothing
    until ``run()``.

    ``lease`` (seconds or timedelta) overrides the queues' lease for the jobs this worker claims.
    ``poll_interval`` bounds how long an idle worker waits before it claims again when no NOTIFY
    arrives (default 1 s); ``listen=False`` relies on polling alone. ``pooled=True`` is the switch
    for a transaction-pooling proxy (PgBouncer ``pool_mode = transaction``): no LISTEN (it needs a
    server connection of its own), no server-side prepared statements, no session state, and
    polling every POOLED_POLL_INTERVAL (0.25 s) unless ``poll_interval`` says otherwise.
    ``sweep_interval`` is how often (jittered; <= 0 turns it off) pgq.sweep recovers expired
    leases. ``shutdown_timeout`` is how long a graceful stop waits for running jobs.

    ``prefetch`` lets the worker hold claimed jobs that wait for a slot, so that a claim can take
    a bigger batch: fewer, larger claims for many short jobs. A prefetched job is ours while it
    waits (its lease runs and is renewed; no other worker can take it), and a graceful stop gives
    it back at once. ``"auto"`` (the default) sizes the prefetch by the handlers' run time: as
    many waiting jobs as the slots get through in AUTO_PREFETCH_WAIT (0.1 s), at most
    AUTO_PREFETCH_MAX (100), a cap that each claim coming back full doubles, up to
    AUTO_PREFETCH_DEEP (1000), and each short one halves again; and none until a job has been
    timed or while jobs take long (a slower job counts at once, a faster one gradually). An
    integer fixes it; 0 means a claim asks for the free slots only.

    A handler that returns None is completed in a batch (pgq.complete_many) with the others
    finished meanwhile; after a claim that came back short, those queued when the worker is about
    to make a small claim go with it, in one pgq.complete_and_claim (Claimer.carries).

    ``metrics_port`` serves the worker's Prometheus metrics on http://metrics_host:port/metrics
    while run() runs (needs pgq-thin[metrics]; 0: a free port, see ``metrics.port``); bound to a
    loopback address it answers only to the loopback Host names, and only ``/metrics``; with
    ``metrics_token`` a scrape needs ``Authorization: Bearer TOKEN``.
    ``tracing`` (on by default) opens one OpenTelemetry span per job attempt when opentelemetry-api
    is installed, from ``tracer_provider`` (None: the global one). See docs/metrics.md.
    """

    _claimer: Claimer | None = None  # while run() runs

    def run(
        self,
        dsn: str | None = None,
        *,
        queues: Sequence[str] | str | None = None,
        concurrency: int | None = None,
        prefetch: int | str | None = None,
        install_signal_handlers: bool = True,
        pooled: bool | None = None,
    ) -> None:
        """Work until stop() or SIGTERM / SIGINT. ``dsn`` None: $PGQ_DSN, then $DATABASE_URL.
        ``queues``, ``concurrency`` and ``prefetch`` replace the constructor's values;
        ``pooled=True`` turns the constructor's switch on. Connection
        loss never ends it; errors that retrying cannot fix (bad arguments, missing privileges) do,
        after a graceful shutdown. A Worker runs once; stop() before run() makes run() return at once."""
        address = self._begin(dsn, queues, concurrency, prefetch, pooled)
        signals = Signals(lambda graceful: self.stop(graceful=graceful), self._flags.stopping.is_set, self.name)
        if install_signal_handlers:
            signals.install()
        try:
            self._serve(address)
        finally:
            signals.restore()

    def stop(self, graceful: bool = True) -> None:
        """Stop claiming and shut down (thread-safe). ``graceful=False`` returns from run() at
        once, without waiting for or releasing running jobs: their leases expire and another
        worker picks them up."""
        self._flags.stopping.set()
        if not graceful:
            self._flags.hard_stop.set()
        if self._claimer is not None:
            self._claimer.wake()

    def _serve(self, dsn: str) -> None:
        """The run between its hooks: on_start, the work, on_stop."""
        for hook in self._on_start:
            hook()
        try:
            self._work(dsn)
        except BaseException:
            self._stop_hooks(raising=False)
            raise
        self._stop_hooks(raising=True)

    def _stop_hooks(self, raising: bool) -> None:
        first: BaseException | None = None
        for hook in self._on_stop:
            try:
                hook()
            except BaseException as exc:  # noqa: BLE001 - every hook runs; the first is raised
                self._stop_hook_failed(hook, exc)
                first = first or exc
        if first is not None and raising:
            raise first

    def _work(self, dsn: str) -> None:
        flags = self._flags
        pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=self.concurrency + 3,  # the slots, the claimer, the completer, the renewer
            kwargs=self.connection_settings(),
            # Each of our threads can always have a connection (max_size), so a call that waits
            # this long means the server is unreachable: it raises ConnectionLost and we back off.
            timeout=2.0,
            name=f"pgq-worker {self.name}",
            open=True,
        )
        client = Client(pool=pool, pooled=self.pooled)
        held = HeldJobs()
        clock = DatabaseClock()
        try:
            clock.read(client)
            self._check_queues(client.queue_status)
            watch = self._watch(held)
        except BaseException:
            pool.close(timeout=1.0)
            raise
        policy = PrefetchPolicy(self.prefetch, self.concurrency)
        owner = OwnerCalls(client, held, flags, self.name)
        # (The claimer, made below, is told when a slot frees and when completions commit; its
        # claims carry the completions queued.)
        completer = Completer(owner, held, flags, recorded=lambda: claimer.recorded())
        wake = threading.Event()  # the claimer's: set when a slot frees, a NOTIFY comes, stop()
        handlers = {kind: chained(h, self._middleware) for kind, h in self._handlers.items()}
        slots = Slots(self.concurrency, Executor(handlers, owner, completer, watch), owner, policy, flags,
                      freed=lambda: claimer.freed())
        renewer = Renewer(client, held, clock, flags, self.lease)
        timer = PollTimer(self.poll_interval, self.sweep_interval, self.queues)
        self._claimer = claimer = Claimer(
            client, self.name, self.queues, self.lease, timer,
            policy, slots, held, owner, clock, flags, self._listening, wake, kinds=self.kinds, completer=completer)
        slots.freed = claimer.freed  # (the same, without the lambda's call per job)
        claimer.metrics = self.metrics

        def cancel_noticed(job_id: int, attempt: int) -> None:  # a pgq_cancel notification: renew it now
            if held.notice_cancel(job_id, attempt):
                renewer.wake()

        listener = Listener(dsn, self.queues, claimer.wake, self.name, self._listening, ignores=timer.pace.ignores,
                            cancelled=cancel_noticed)
        background: list[Part] = [renewer, completer, *([listener] if self.listen else [])]
        slots.start()
        for part in background:
            part.start()
        self._started()
        try:
            claimer.run()
        finally:
            listener.stop()
            self._shutdown(slots, held, owner, completer)
            flags.done.set()
            slots.stop()
            renewer.stop()
            completer.stop()
            if not flags.hard_stop.is_set():
                for part in background:
                    part.join(timeout=5.0)
            pool.close(timeout=1.0)
            self._unwatch()
            log.info("worker %s stopped", self.name, extra={"worker": self.name})

    def _shutdown(self, slots: Slots, held: HeldJobs, owner: OwnerCalls, completer: Completer) -> None:
        """Give back the jobs no slot started; wait up to shutdown_timeout for running jobs,
        recording their completions as they come; give back those still running. After a hard
        stop: one quick try to record the completions queued, or their leases cover them."""
        hard_stop = self._flags.hard_stop
        if hard_stop.is_set():
            completer.try_flush()
            return
        for waiting in slots.take_waiting():
            owner.give_back_unstarted(waiting, "claimed before shutdown, never started")
        deadline = time.monotonic() + self.shutdown_timeout
        if held:
            log.info("waiting up to %.0fs for %d running jobs", self.shutdown_timeout, len(held),
                     extra={"worker": self.name})
        while held and time.monotonic() < deadline:
            completer.try_flush()
            if hard_stop.wait(0.05):
                completer.try_flush()
                return
        completer.try_flush()
        for left in held.jobs():
            verdict = held.take_over(left)
            if verdict is Verdict.BUSY:
                left.log.warning("still renewing its lease at exit; its lease covers it")
            elif verdict is Verdict.GRANTED:
                owner.give_back(left.job, f"still running after shutdown_timeout ({self.shutdown_timeout}s)")
