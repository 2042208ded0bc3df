"""Worker: the thread runtime. Its run is pgq_thin.worker.threads.engine's Run, generated (as every
part it builds) from the asyncio runtime's (pgq_thin.worker.engine)."""

from __future__ import annotations

from collections.abc import Sequence

from pgq_thin.worker.base import WorkerBase
from pgq_thin.worker.signals import Signals
from pgq_thin.worker.threads.engine import Run

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
    leases. ``heartbeat_interval`` is how often (<= 0: never) the worker refreshes its entry in
    the registry of live workers (pgq.worker_heartbeat; pgq.workers() lists it while its last
    heartbeat is under three intervals old); at start it also warns about the kinds of its queues'
    pending jobs that no running worker handles. ``shutdown_timeout`` is how long a graceful stop
    waits for running jobs.

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

    ``keys`` (key id -> 32 bytes) and ``encrypt_with`` (the id of the key that encrypts): each
    claimed job's encrypted payload is decrypted for its handler with whichever key of the ring
    its envelope names, and the result is stored encrypted under ``encrypt_with`` (as are the
    payloads of the children a durable handler spawns). A job whose envelope names a key not in
    the ring, or was altered, fails for good (not retryable) with an error naming the key id.
    See docs/encryption.md (the extra ``pgq-thin[encryption]``).
    """

    _run: Run | None = None  # while run() runs

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
        run = self._run
        if run is not None and run.nudge is not None:
            run.nudge.wake()

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
        self._run = Run(self, dsn)
        self._run.work()
