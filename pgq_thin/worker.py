"""The worker runtime: run registered handlers on claimed jobs, in N threads.

    worker = Worker(queues=["default"], concurrency=4)

    @worker.handler("send_email")
    def send_email(job, ctx):
        ...                      # return a JSON-serializable result (or None)

    worker.run()                 # blocks until SIGTERM / SIGINT or worker.stop()

Where things happen (every state change is one pgq function, called through pgq_thin.Client):

- ``Worker._claim_loop``: THE CLAIM LOOP. Claims as many jobs as there are free slots (plus free
  places of the prefetch: jobs that wait for a slot, see ``Worker._prefetch_now``) with pgq.claim
  and hands them to the slot threads, sweeps now and then (pgq.sweep), and sleeps until a NOTIFY,
  a free slot or the next poll.
- ``Worker._execute``: runs one handler in one of the ``concurrency`` slot threads and turns its
  outcome into exactly one owner call: a handler that returns None joins the next
  pgq.complete_many batch (``Worker._complete_loop`` records every completion queued since its
  last call in one statement, on its own connection, while the claim loop claims); any other
  outcome is one call of pgq.complete (with the result),
  pgq.fail, pgq.snooze or pgq.mark_unknown (``_settle``), retried with the same attempt while the
  connection is down: those calls are idempotent for the same attempt.
- ``Worker._renew_loop``: renews every running job's lease at about a third of the lease
  (pgq.renew); a job that is no longer ours gets ``ctx.lease_lost`` and its outcome is discarded.
- ``Worker._listen_loop``: LISTEN pgq on a dedicated connection; a payload naming one of our
  queues wakes the claim loop. Polling is the fallback (and the only mechanism with listen=False).
- ``Worker._shutdown``: graceful stop: waits for running jobs up to shutdown_timeout, then gives
  back what is left (pgq.release). A second signal skips all of that: the leases cover it.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import random
import secrets
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
from psycopg_pool import ConnectionPool

from pgq_thin.client import Client, resolve_dsn
from pgq_thin.errors import ConnectionLost, PgqError
from pgq_thin.models import Job

__all__ = ["Handler", "JobContext", "OutcomeUnknown", "Retry", "Snooze", "Worker"]

log = logging.getLogger("pgq_thin.worker")

#: The channel the pgq functions notify, with the queue name as payload.
CHANNEL = "pgq"

#: prefetch="auto": claimed jobs may wait for a slot as long as, by the handlers' measured run
#: time, the last of them is expected to start within AUTO_PREFETCH_WAIT seconds; never more than
#: AUTO_PREFETCH_MAX of them.
AUTO_PREFETCH_WAIT = 0.1
AUTO_PREFETCH_MAX = 100
#: How often a pooled worker (no LISTEN) polls when poll_interval is not given.
POOLED_POLL_INTERVAL = 0.25


# What a handler sees ---------------------------------------------------------------------------


class JobContext:
    """Handed to a handler with its job.

    ``lease_lost`` is set when the job is no longer ours (a renewal was refused, or the worker gave
    the job back at shutdown): stop, since whatever the handler returns will be discarded.
    ``shutting_down`` is set when the worker stops claiming: finish soon, or be released after
    shutdown_timeout. A long handler should check ``should_stop`` between steps.
    """

    def __init__(self, job: Job, client: Client, worker_name: str,
                 shutting_down: threading.Event | None = None) -> None:
        self.job = job
        self.client = client
        self.worker_name = worker_name
        self.shutting_down = shutting_down if shutting_down is not None else threading.Event()
        # Made on first use: most jobs never need one, and an Event costs more to make than
        # the rest of a job's bookkeeping together.
        self._lease_lost: threading.Event | None = None

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
    def should_stop(self) -> bool:
        return self._is_lost() or self.shutting_down.is_set()

    def _is_lost(self) -> bool:
        """lease_lost.is_set(), without making the Event."""
        event = self._lease_lost
        return event is not None and event.is_set()

    def __repr__(self) -> str:
        return f"JobContext(job={self.job!r}, worker_name={self.worker_name!r})"


_LEASE_LOST_MADE = threading.Lock()  # makes JobContext.lease_lost once per job, whoever asks first


#: A handler: called with the job and its context; its return value becomes the job's result.
Handler = Callable[[Job, JobContext], Any]
_H = TypeVar("_H", bound=Handler)

Delay = float | timedelta


def _seconds(delay: Delay) -> float:
    return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


class Retry(Exception):
    """Raise in a handler to fail this attempt and retry after ``delay`` (pgq.fail with retry_in).
    ``delay=None`` uses the queue's backoff. Counts as an attempt."""

    def __init__(self, delay: float | timedelta | None = None, reason: str = "retry requested") -> None:
        if delay is not None and _seconds(delay) <= 0:
            raise ValueError(f"Retry delay must be positive, got {delay!r}")
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class Snooze(Exception):
    """Raise in a handler to run the job again after ``delay`` without using up an attempt
    (pgq.snooze)."""

    def __init__(self, delay: float | timedelta) -> None:
        if _seconds(delay) <= 0:
            raise ValueError(f"Snooze delay must be positive, got {delay!r}")
        super().__init__(f"snoozed for {delay}")
        self.delay = delay


class OutcomeUnknown(Exception):
    """Raise in a handler when the outside effect may or may not have happened (a timeout after
    the request was sent): the job is parked as outcome_unknown until pgq.resolve settles it."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


# Small helpers -----------------------------------------------------------------------------------


class _Backoff:
    """Exponential delays with jitter: the n-th delay is random in [d/2, d], d = min(cap, first * 2**n)."""

    def __init__(self, first: float, cap: float) -> None:
        self.first = min(first, cap)
        self.cap = cap
        self._n = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.first * 2 ** min(self._n, 30))
        self._n += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._n = 0


def _jitter(seconds: float) -> float:
    """``seconds`` scaled by a random factor in [0.8, 1.2], so that many workers drift apart."""
    return seconds * random.uniform(0.8, 1.2)


def _transient(exc: BaseException) -> bool:
    """Worth retrying: the connection broke, or the server asked us to come back later
    (serialization failure / deadlock 40, insufficient resources 53, operator intervention 57,
    lock timeout 55P03)."""
    if isinstance(exc, ConnectionLost):
        return True
    if isinstance(exc, psycopg.OperationalError):
        return True
    # 55P03: lock_timeout (a claim waiting its turn on a capped queue, say).
    return isinstance(exc, PgqError) and ((exc.sqlstate or "")[:2] in ("40", "53", "57") or exc.sqlstate == "55P03")


class _JobLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The worker's logger for one job: messages start with "job <id> (<kind>, attempt <n>)" and
    carry job_id, attempt, kind and queue as ``extra=`` fields for structured handlers."""

    def __init__(self, job: Job) -> None:
        super().__init__(log)
        self.job = job  # the prefix and fields are built only for a message that is logged

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        job = self.job
        kwargs["extra"] = {"job_id": job.id, "attempt": job.attempt, "kind": job.kind, "queue": job.queue,
                           **kwargs.get("extra", {})}
        return f"job {job.id} ({job.kind}, attempt {job.attempt}): {msg}", kwargs


def _default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass
class _Running:
    """A claimed job while this worker holds it. ``lock`` serialises the renewer and the one call
    that settles the job; ``settled`` means no more calls for this attempt (done or given up)."""

    job: Job
    ctx: JobContext
    log: _JobLog
    lease_seconds: float
    next_renew: float  # time.monotonic()
    lock: threading.Lock = field(default_factory=threading.Lock)
    settled: bool = False


# The worker ----------------------------------------------------------------------------------------


class Worker:
    """Runs handlers for the jobs of ``queues`` in ``concurrency`` threads. Connects to nothing
    until ``run()``.

    ``lease`` (seconds or timedelta) overrides the queues' lease for the jobs this worker claims.
    ``poll_interval`` bounds how long an idle worker waits before it claims again when no NOTIFY
    arrives (default 1 s); ``listen=False`` relies on polling alone. ``pooled=True`` is the switch
    for a transaction-pooling proxy (PgBouncer ``pool_mode = transaction``): no LISTEN (it would
    hold no server connection of its own), no server-side prepared statements, no session state,
    and polling every POOLED_POLL_INTERVAL (0.25 s) unless ``poll_interval`` says otherwise.
    ``sweep_interval`` is how often (jittered; <= 0 turns it off) pgq.sweep recovers expired
    leases. ``shutdown_timeout`` is how long a graceful stop waits for running jobs.

    ``prefetch`` lets the worker hold claimed jobs that wait for a slot, so that a claim can take
    a bigger batch: fewer, larger claims for many short jobs. A prefetched job is ours while it
    waits (its lease runs and is renewed; no other worker can take it), and a graceful stop gives
    it back at once. ``"auto"`` (the default) sizes the prefetch by the handlers' run time: as
    many waiting jobs as the slots get through in AUTO_PREFETCH_WAIT (0.1 s), at most
    AUTO_PREFETCH_MAX (100), and none until a job has been timed or while jobs take long (a
    slower job counts at once, a faster one gradually). An integer fixes it; 0 means a claim asks
    for the free slots only.
    """

    def __init__(
        self,
        queues: Sequence[str] | str | None = ("default",),
        concurrency: int = 4,
        *,
        name: str | None = None,
        lease: float | timedelta | None = None,
        poll_interval: float | None = None,
        listen: bool = True,
        pooled: bool = False,
        sweep_interval: float = 30.0,
        shutdown_timeout: float = 30.0,
        prefetch: int | str = "auto",
    ) -> None:
        if poll_interval is not None and poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval}")
        if lease is not None and _seconds(lease) <= 0:
            raise ValueError(f"lease must be positive, got {lease!r}")
        self.queues = self._check_queues(queues)
        self.concurrency = self._check_concurrency(concurrency)
        self.prefetch = self._check_prefetch(prefetch)
        self.name = name or _default_name()
        self.lease = lease
        self._poll_interval = poll_interval
        self.poll_interval = 1.0 if poll_interval is None else poll_interval
        self.listen = listen
        self.pooled = False
        if pooled:
            self._set_pooled()
        self.sweep_interval = sweep_interval
        self.shutdown_timeout = shutdown_timeout
        self._handlers: dict[str, Handler] = {}

        # Set by stop(); shared with every JobContext as ctx.shutting_down.
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        # Set to make the claim loop look again: a NOTIFY for our queues, a slot freed, stop().
        self._wake = threading.Event()
        self._listening = threading.Event()
        self._done = threading.Event()  # run() is over: background threads give up
        # Every job we hold: claimed and not yet recorded (running, or its completion waiting for
        # the next complete_many). The renewer renews them; shutdown gives back what is left.
        self._active: dict[int, _Running] = {}
        self._active_lock = threading.Lock()
        self._assigned = 0  # jobs handed to the slots (running, or waiting for one), not yet returned
        self._job_seconds: float | None = None  # the handlers' run time, for prefetch="auto"
        self._ready: queue.SimpleQueue[_Running | None] = queue.SimpleQueue()  # claimed, for the slots
        self._completions: list[_Running] = []  # handlers returned None: complete_many them
        self._completions_lock = threading.Lock()
        self._completions_queued = threading.Event()
        self._clock_offset = 0.0  # database clock minus local clock, in seconds
        self._client: Client | None = None
        self._dsn = ""
        self._ran = False

    # Registration -------------------------------------------------------------------------------

    def handler(self, kind: str) -> Callable[[_H], _H]:
        """Register the decorated function for jobs of ``kind``; returns it unchanged."""

        def register(function: _H) -> _H:
            if kind in self._handlers:
                raise ValueError(f"a handler for kind {kind!r} is already registered")
            self._handlers[kind] = function
            return function

        return register

    @property
    def kinds(self) -> list[str]:
        """The kinds this worker has handlers for."""
        return sorted(self._handlers)

    def _set_pooled(self) -> None:
        self.pooled = True
        self.listen = False
        if self._poll_interval is None:
            self.poll_interval = POOLED_POLL_INTERVAL

    # Running ------------------------------------------------------------------------------------

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
        ``queues``, ``concurrency`` and ``prefetch`` replace the constructor's values; ``pooled=True``
        turns the constructor's switch on. Connection
        loss never ends it; errors that retrying cannot fix (bad arguments, missing privileges) do,
        after a graceful shutdown. A Worker runs once; stop() before run() makes run() return at once."""
        if self._ran:
            raise RuntimeError("this Worker has already run; create a new one")
        self._dsn = resolve_dsn(dsn)
        try:
            psycopg.conninfo.conninfo_to_dict(self._dsn)  # a malformed DSN fails here, not in a loop
        except psycopg.ProgrammingError as exc:
            raise PgqError(f"invalid database address: {str(exc).strip()}") from exc
        if queues is not None:
            self.queues = self._check_queues(queues)
        if concurrency is not None:
            self.concurrency = self._check_concurrency(concurrency)
        if prefetch is not None:
            self.prefetch = self._check_prefetch(prefetch)
        if pooled:
            self._set_pooled()
        self._ran = True
        if not self._handlers:
            log.warning("no handlers registered: every job claimed will fail", extra={"worker": self.name})

        previous = self._install_signal_handlers() if install_signal_handlers else {}
        try:
            self._serve()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _serve(self) -> None:
        pool = ConnectionPool(
            self._dsn,
            min_size=1,
            max_size=self.concurrency + 3,  # the slots, the claim loop, the completer, the renewer
            kwargs={"autocommit": True, "application_name": f"pgq-worker {self.name}"[:63], **_KEEPALIVES,
                    **({"prepare_threshold": None} if self.pooled else {})},
            # Each of our threads can always have a connection (max_size), so a call that waits
            # this long means the server is unreachable: it raises ConnectionLost and we back off.
            timeout=2.0,
            name=f"pgq-worker {self.name}",
            open=True,
        )
        self._client = Client(pool=pool, pooled=self.pooled)
        self._read_database_clock()
        slots = [threading.Thread(target=self._slot_loop, name=f"pgq-slot-{n}", daemon=True)
                 for n in range(1, self.concurrency + 1)]
        for slot in slots:
            slot.start()
        threads = [threading.Thread(target=self._renew_loop, name="pgq-renew", daemon=True),
                   threading.Thread(target=self._complete_loop, name="pgq-complete", daemon=True)]
        if self.listen:
            threads.append(threading.Thread(target=self._listen_loop, name="pgq-listen", daemon=True))
        for thread in threads:
            thread.start()
        log.info("worker %s started: queues %s, %d slots, %s", self.name,
                 ", ".join(self.queues) if self.queues else "(all)", self.concurrency,
                 "LISTEN and polling" if self.listen
                 else f"polling only (every {self.poll_interval:g} s{', pooled' if self.pooled else ''})",
                 extra={"worker": self.name, "queues": self.queues, "concurrency": self.concurrency})
        try:
            self._claim_loop()
        finally:
            self._shutdown()
            self._done.set()
            for _ in slots:
                self._ready.put(None)  # a slot still in a handler stays a daemon thread
            if not self._hard_stop.is_set():
                for thread in threads:
                    thread.join(timeout=5.0)
            pool.close(timeout=1.0)
            log.info("worker %s stopped", self.name, extra={"worker": self.name})

    def stop(self, graceful: bool = True) -> None:
        """Stop claiming and shut down (thread-safe). ``graceful=False`` returns from run() at
        once, without waiting for or releasing running jobs: their leases expire and another
        worker picks them up."""
        self._stopping.set()
        if not graceful:
            self._hard_stop.set()
        self._wake.set()

    # The claim loop -------------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        idle = _Backoff(first=min(0.05, self.poll_interval), cap=self.poll_interval)
        errors = _Backoff(first=0.2, cap=15.0)
        # No sweep at start: every claim recovers expired leases first.
        next_sweep = time.monotonic() + _jitter(self.sweep_interval) if self.sweep_interval > 0 else math.inf
        while not self._stopping.is_set():
            if time.monotonic() >= next_sweep:
                self._housekeeping()
                next_sweep = time.monotonic() + _jitter(self.sweep_interval)
                continue  # look at the stop flag again: the sweep may have waited for a connection
            prefetch = self._prefetch_now()
            free = self.concurrency + prefetch - self._assigned
            # Claim when a slot is idle; while every slot is busy, wait until the line of waiting
            # jobs is half empty, so that claims stay large. A finishing job wakes us.
            if free <= 0 or (self._assigned >= self.concurrency and free < (prefetch + 1) // 2):
                self._sleep(self.poll_interval, next_sweep)
                continue
            try:
                jobs = self._claim(free)
            except PgqError as exc:
                if not _transient(exc):
                    raise
                delay = errors.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay, extra={"worker": self.name})
                self._drop_broken_connections()
                self._sleep(delay, next_sweep)
                continue
            errors.reset()
            for job in jobs:
                self._start(job)
            if jobs:
                # There may be more (a batch can come back short when other workers claim at the
                # same moment): claim again as soon as a slot is free.
                idle.reset()
                continue
            # Nothing is due. A NOTIFY wakes us for new work; polling finds scheduled jobs and
            # covers a missing or broken LISTEN, backing off from quick retries to poll_interval.
            self._sleep(idle.next() if not self._listening.is_set()
                        else min(self.poll_interval, _jitter(self.poll_interval)), next_sweep)

    def _prefetch_now(self) -> int:
        """How many claimed jobs may wait for a slot now."""
        if self.prefetch != "auto":
            return int(self.prefetch)
        seconds = self._job_seconds
        if seconds is None:
            return 0
        return min(AUTO_PREFETCH_MAX, int(AUTO_PREFETCH_WAIT * self.concurrency / max(seconds, 1e-6)))

    def _timed(self, seconds: float) -> None:
        """Account a handler's run time (under _active_lock): a slower job counts at once, so that
        long jobs stop the prefetch right away; a faster one moves the estimate 5% of the way."""
        known = self._job_seconds
        self._job_seconds = seconds if known is None or seconds > known else known + 0.05 * (seconds - known)

    def _sleep(self, seconds: float, next_sweep: float) -> None:
        """Wait until woken, ``seconds`` pass or the next sweep is due. The wake-up is cleared
        *before* the next claim, so a job committed before the clear is seen by that claim."""
        self._wake.wait(max(0.0, min(seconds, next_sweep - time.monotonic())))
        self._wake.clear()

    def _claim(self, free: int) -> list[Job]:
        assert self._client is not None
        jobs = self._client.claim(self.name, self.queues, batch=min(free, 1000), lease=self.lease)
        log.debug("claimed %d of %d", len(jobs), free,
                  extra={"worker": self.name, "batch": free, "claimed": len(jobs)})
        return jobs

    def _housekeeping(self) -> None:
        """pgq.sweep, so expired leases recover even when nobody claims; and re-read the database
        clock, which leases are measured by."""
        assert self._client is not None
        try:
            recovered = self._client.sweep()
        except PgqError as exc:
            log.warning("sweep failed: %s", exc, extra={"worker": self.name})
            return
        if recovered:
            log.info("sweep recovered %d jobs with expired leases", recovered,
                     extra={"worker": self.name, "recovered": recovered})
        self._read_database_clock()

    def _read_database_clock(self) -> None:
        """The lease is measured by the database clock, so a worker whose clock is off by minutes
        must not renew by its own: keep the offset between the two."""
        assert self._client is not None
        try:
            with self._client.pool.connection() as conn:
                before = time.time()
                row = conn.execute("SELECT clock_timestamp()").fetchone()
                after = time.time()
        except psycopg.Error as exc:
            log.debug("could not read the database clock: %s", exc, extra={"worker": self.name})
            return
        if row is not None:
            self._clock_offset = row[0].timestamp() - (before + after) / 2

    # One job ----------------------------------------------------------------------------------------

    def _start(self, job: Job) -> None:
        """Hand ``job`` to a free slot thread, or give it back if we are stopping."""
        if self._stopping.is_set():
            self._give_back(job, "claimed during shutdown, never started")
            return
        if self.lease is not None:
            lease_seconds = _seconds(self.lease)
        else:  # the queue's lease: what is left of it now, by the database clock
            lease_seconds = job.lease_until.timestamp() - (time.time() + self._clock_offset)
        lease_seconds = max(lease_seconds, 0.3)
        assert self._client is not None
        ctx = JobContext(job=job, client=self._client, worker_name=self.name, shutting_down=self._stopping)
        running = _Running(job, ctx, _JobLog(job), lease_seconds, time.monotonic() + lease_seconds / 3)
        with self._active_lock:
            self._active[job.id] = running
            self._assigned += 1
        self._ready.put(running)

    def _slot_loop(self) -> None:
        """One slot: run the jobs the claim loop hands over, one at a time, until told to stop."""
        while True:
            running = self._ready.get()
            if running is None:
                return
            started: float | None = None
            try:
                if self._stopping.is_set():
                    self._give_back_unstarted(running)
                else:
                    started = time.monotonic()
                    self._execute(running)
            except BaseException:  # noqa: BLE001 - a slot must survive anything; the lease covers the job
                running.log.exception("the slot failed while running this job")
                self._forget(running)
            finally:
                with self._active_lock:
                    self._assigned -= 1
                    if started is not None:
                        self._timed(time.monotonic() - started)
                self._wake.set()  # a free slot, and maybe a completion to record

    def _forget(self, running: _Running) -> None:
        with self._active_lock:
            self._active.pop(running.job.id, None)

    def _execute(self, running: _Running) -> None:
        """Run the handler; record its outcome with exactly one owner call (a completion without
        result joins the claim loop's next complete_many)."""
        job, ctx, jlog, client = running.job, running.ctx, running.log, running.ctx.client
        jlog.debug("started")
        deferred = False
        try:
            function = self._handlers.get(job.kind)
            if function is None:
                error = (f"no handler for kind {job.kind!r} in worker {self.name!r} "
                         f"(it handles: {', '.join(self.kinds) or 'nothing'})")
                jlog.error("no handler for this kind")
                self._settle(running, "fail", lambda: client.fail(job.id, job.attempt, error, retryable=False))
                return
            try:
                result = function(job, ctx)
            except Retry as exc:
                reason, retry_in = exc.reason, exc.delay
                jlog.info("retry requested: %s", reason)
                self._settle(running, "fail", lambda: client.fail(job.id, job.attempt, reason, retry_in=retry_in))
            except Snooze as exc:
                delay = exc.delay
                jlog.info("snoozed for %s", delay)
                self._settle(running, "snooze", lambda: client.snooze(job.id, job.attempt, delay))
            except OutcomeUnknown as exc:
                note = exc.note
                jlog.warning("outcome unknown: %s", note)
                self._settle(running, "mark_unknown", lambda: client.mark_unknown(job.id, job.attempt, note))
            except BaseException as exc:  # noqa: BLE001 - any handler failure fails the attempt
                error = traceback.format_exc()
                jlog.warning("handler raised %r", exc, exc_info=True)
                self._settle(running, "fail", lambda: client.fail(job.id, job.attempt, error))
            else:
                if result is None:
                    deferred = self._complete_later(running)
                else:
                    self._settle(running, "complete", lambda: client.complete(job.id, job.attempt, result))
        finally:
            if not deferred:
                self._forget(running)

    def _complete_later(self, running: _Running) -> bool:
        """Queue the completion of a handler that returned None for the claim loop's next
        pgq.complete_many (fenced per job like pgq.complete). False when the job is no longer ours."""
        with running.lock:
            if running.settled or running.ctx._is_lost():
                running.log.warning("no longer ours: complete not sent, the handler's outcome is discarded")
                return False
            running.settled = True  # the renewer leaves it alone from now on
        with self._completions_lock:
            self._completions.append(running)
        self._completions_queued.set()
        return True

    def _complete_loop(self) -> None:
        """Record queued completions, each time all of those queued since the last call in one
        pgq.complete_many, until run() is over (shutdown records the last ones itself)."""
        errors = _Backoff(first=0.1, cap=10.0)
        while not self._done.is_set() and not self._hard_stop.is_set():
            if not self._completions_queued.wait(0.5):
                continue
            self._completions_queued.clear()
            try:
                self._flush_completions()
            except PgqError as exc:  # a connection error: the batch stays queued; try again
                delay = errors.next()
                log.warning("complete_many did not reach the server (%s); repeating it in %.1fs", exc, delay,
                            extra={"worker": self.name})
                self._drop_broken_connections()
                self._completions_queued.set()
                self._hard_stop.wait(delay)
                continue
            errors.reset()

    def _flush_completions(self) -> None:
        """Record every queued completion with one pgq.complete_many. On a connection error the
        batch stays queued and the error is raised (every pair is idempotent for its attempt); a
        refusal that retrying cannot fix fails each job instead, as a refused complete would."""
        with self._completions_lock:
            batch, self._completions = self._completions, []
        if not batch:
            return
        assert self._client is not None
        try:
            done = set(self._client.complete_many([r.job.id for r in batch], [r.job.attempt for r in batch]))
        except Exception as exc:
            if _transient(exc) and not self._done.is_set():
                with self._completions_lock:
                    self._completions[:0] = batch
                raise
            for running in batch:
                self._refused("complete", running, exc)
                self._forget(running)
            return
        with self._active_lock:
            for running in batch:
                self._active.pop(running.job.id, None)
        for running in batch:
            if running.job.id in done:
                running.log.info("completed")
            else:
                running.log.warning("complete rejected: the job is no longer ours "
                                    "(its lease expired, or it was cancelled)")

    def _settle(self, running: _Running, operation: str, call: Callable[[], Any]) -> None:
        """Make the one call that records the handler's outcome, unless the job is no longer ours.
        While the connection is down the call is repeated with the same attempt (every owner
        operation is idempotent for its attempt) until it answers, so a finished job is never
        lost. (Renewing meanwhile would be pointless: it needs the same server.)"""
        jlog = running.log
        with running.lock:
            if running.settled or running.ctx._is_lost():
                jlog.warning("no longer ours: %s not sent, the handler's outcome is discarded", operation)
                return
            running.settled = True
            try:
                answer = self._until_answered(operation, jlog, call)
            except Exception as exc:  # noqa: BLE001
                self._refused(operation, running, exc)
                return
        if answer is None or answer is False:
            jlog.warning("%s rejected: the job is no longer ours (its lease expired, or it was cancelled)", operation)
        else:
            jlog.info({"complete": "completed", "fail": f"failed, now {answer}", "snooze": f"snoozed until {answer}",
                       "mark_unknown": "marked outcome_unknown"}[operation])

    def _until_answered(self, operation: str, jlog: _JobLog, call: Callable[[], Any]) -> Any:
        backoff = _Backoff(first=0.1, cap=10.0)
        while True:
            try:
                return call()
            except Exception as exc:
                if not _transient(exc) or self._hard_stop.is_set() or self._done.is_set():
                    raise
                delay = backoff.next()
                jlog.warning("%s did not reach the server (%s); repeating it in %.1fs", operation, exc, delay)
                self._drop_broken_connections()
                self._hard_stop.wait(delay)

    def _refused(self, operation: str, running: _Running, exc: Exception) -> None:
        """The outcome call failed for good: we are exiting, or it was refused (a snooze delay out
        of range, a result that is not JSON). Then fail the attempt, not retryable, so that
        someone looks at it. If nothing answers, the lease recovers the job."""
        job, jlog, client = running.job, running.log, running.ctx.client
        if _transient(exc):
            jlog.warning("%s abandoned at exit; the lease will recover the job", operation)
            return
        jlog.error("%s refused: %s", operation, exc)
        if operation == "fail":
            return
        error = f"pgq_thin worker: {operation} of this attempt was refused: {type(exc).__name__}: {exc}"
        try:
            state = self._until_answered("fail", jlog, lambda: client.fail(job.id, job.attempt, error,
                                                                        retryable=False))
            jlog.info("failed instead, now %s", state)
        except Exception as again:  # noqa: BLE001
            jlog.error("fail refused too (%s); the lease will recover the job", again)

    def _drop_broken_connections(self) -> None:
        """After a connection error, test the pool's idle connections and replace the dead ones,
        so that the next call does not pick another connection the server has already closed."""
        if self._client is not None and not self._done.is_set():
            try:
                self._client.pool.check()
            except Exception as exc:  # noqa: BLE001 - best effort; the next call reports real trouble
                log.debug("pool check failed: %s", exc, extra={"worker": self.name})

    def _give_back(self, job: Job, why: str) -> None:
        """pgq.release: pending again now, the attempt not counted. One try: if it does not
        answer, the lease expires and the job is recovered anyway."""
        assert self._client is not None
        jlog = _JobLog(job)
        try:
            released = self._client.release(job.id, job.attempt)
        except PgqError as exc:
            jlog.warning("release failed (%s); the lease will recover the job", exc)
            return
        if released:
            jlog.info("released (%s): pending again", why)
        else:
            jlog.warning("release rejected: the job is no longer ours")

    # Lease renewal ----------------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        """Renew each running job at about a third of its lease. A refusal (NULL) means another
        attempt owns the job now: tell the handler, and discard its outcome."""
        assert self._client is not None
        while not self._done.is_set() and not self._hard_stop.is_set():
            now = time.monotonic()
            with self._active_lock:
                running_jobs = list(self._active.values())
            for running in running_jobs:
                if running.next_renew <= now:
                    self._renew(running)
            upcoming = [r.next_renew for r in running_jobs if not r.settled]
            wait = min(upcoming, default=now + 0.5) - time.monotonic()
            self._done.wait(min(max(wait, 0.05), 0.5))

    def _renew(self, running: _Running) -> None:
        assert self._client is not None
        job, jlog = running.job, running.log
        if not running.lock.acquire(blocking=False):
            return  # its outcome is being recorded right now
        try:
            if running.settled or running.ctx._is_lost():
                return
            try:
                until = self._client.renew(job.id, job.attempt, lease=self.lease)
            except PgqError as exc:
                running.next_renew = time.monotonic() + min(1.0, running.lease_seconds / 6)
                jlog.warning("lease renewal failed (%s); trying again", exc)
                return
            if until is None:
                running.ctx.lease_lost.set()
                jlog.warning("lease lost: the job is no longer ours; the handler's outcome will be discarded")
                return
            if self.lease is None:  # the queue's lease may have been reconfigured
                running.lease_seconds = max(until.timestamp() - (time.time() + self._clock_offset), 0.3)
            running.next_renew = time.monotonic() + running.lease_seconds / 3
            jlog.debug("lease renewed until %s", until.isoformat())
        finally:
            running.lock.release()

    # Wake-up by LISTEN ------------------------------------------------------------------------------

    def _listen_loop(self) -> None:
        """LISTEN on a dedicated connection; reconnect with backoff when it breaks. While it is
        down the claim loop polls faster (its idle backoff) instead of waiting poll_interval."""
        backoff = _Backoff(first=0.2, cap=15.0)
        lost = False
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5,
                                     application_name=f"pgq-listen {self.name}"[:63], **_KEEPALIVES) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    self._wake.set()  # anything enqueued while we were not listening
                    backoff.reset()
                    if lost:
                        log.info("LISTEN restored", extra={"worker": self.name})
                        lost = False
                    while not self._stopping.is_set():
                        for notify in conn.notifies(timeout=0.25):
                            if self.queues is None or notify.payload in self.queues:
                                self._wake.set()
            except psycopg.Error as exc:
                self._listening.clear()
                if self._stopping.is_set():
                    break
                delay = backoff.next()
                log.log(logging.DEBUG if lost else logging.WARNING,
                        "LISTEN connection lost (%s); polling until it is back, reconnecting in %.1fs",
                        exc, delay, extra={"worker": self.name})
                lost = True
                self._stopping.wait(delay)
        self._listening.clear()

    # Shutdown ---------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        """First SIGTERM / SIGINT: graceful stop. Second: stop at once. Only in the main thread
        (Python allows signal handlers nowhere else)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        signals = 0

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # This runs in the main thread between two bytecodes, maybe while that thread holds
            # the lock of one of our Events (the claim loop waits on and clears _wake): setting
            # it from here would wait for ourselves forever. So only count here, and stop from a
            # thread of its own, which gets the lock as soon as the main thread lets go.
            nonlocal signals
            signals += 1
            graceful = signals == 1 and not self._stopping.is_set()  # is_set takes no lock
            threading.Thread(target=self._stop_on_signal, args=(signum, graceful),
                             name="pgq-signal", daemon=True).start()

        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
        return previous

    def _stop_on_signal(self, signum: int, graceful: bool) -> None:
        log.warning("%s: %s", signal.Signals(signum).name,
                    "shutting down gracefully (send it again to stop at once)" if graceful
                    else "stopping at once; running jobs are recovered when their leases expire",
                    extra={"worker": self.name})
        self.stop(graceful=graceful)

    def _shutdown(self) -> None:
        """Wait up to shutdown_timeout for running jobs, recording their completions as they
        come; give back those still running."""
        self._stopping.set()
        if self._hard_stop.is_set():
            self._try_flush()  # finished handlers: one quick try, or their leases cover them
            return
        self._give_back_waiting()
        deadline = time.monotonic() + self.shutdown_timeout
        if self._active:
            log.info("waiting up to %.0fs for %d running jobs", self.shutdown_timeout, len(self._active),
                     extra={"worker": self.name})
        while self._active and time.monotonic() < deadline:
            self._try_flush()
            if self._hard_stop.wait(0.05):
                self._try_flush()
                return
        self._try_flush()
        with self._active_lock:
            left = list(self._active.values())
        for running in left:
            if not running.lock.acquire(blocking=False):
                running.log.warning("still recording its outcome at exit; its lease covers it")
                continue
            try:
                if running.settled or running.ctx._is_lost():
                    continue
                running.settled = True
                running.ctx.lease_lost.set()  # the handler's outcome is discarded from now on
                self._give_back(running.job, f"still running after shutdown_timeout ({self.shutdown_timeout}s)")
            finally:
                running.lock.release()

    def _give_back_waiting(self) -> None:
        """Give back, now, the claimed jobs no slot has started (prefetched, or claimed just
        before the stop); the slots would do it too, but only once their handlers return."""
        waiting: list[_Running] = []
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                waiting.append(item)
        for running in waiting:
            self._give_back_unstarted(running)
            with self._active_lock:
                self._assigned -= 1

    def _give_back_unstarted(self, running: _Running) -> None:
        """A job claimed before the stop that no slot started: give it back (unless shutdown
        already did) and forget it."""
        with running.lock:
            unsettled, running.settled = not running.settled, True
        if unsettled:
            self._give_back(running.job, "claimed before shutdown, never started")
        self._forget(running)

    def _try_flush(self) -> None:
        try:
            self._flush_completions()
        except PgqError as exc:
            log.warning("complete_many did not reach the server at shutdown (%s); the leases cover "
                        "those jobs", exc, extra={"worker": self.name})

    # Argument checks --------------------------------------------------------------------------------

    @staticmethod
    def _check_queues(queues: Sequence[str] | str | None) -> list[str] | None:
        """A list of queue names; a string is split on commas; None means every queue."""
        if queues is None:
            return None
        names: Iterable[str] = queues.split(",") if isinstance(queues, str) else queues
        cleaned = [q.strip() for q in names if q and q.strip()]
        if not cleaned:
            raise ValueError("queues must name at least one queue (or be None for all queues)")
        return cleaned

    @staticmethod
    def _check_prefetch(prefetch: int | str) -> int | str:
        if prefetch == "auto":
            return prefetch
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0 or prefetch > 1000:
            raise ValueError(f"prefetch must be \"auto\" or an integer from 0 to 1000, got {prefetch!r}")
        return prefetch

    @staticmethod
    def _check_concurrency(concurrency: int) -> int:
        if not isinstance(concurrency, int) or concurrency < 1 or concurrency > 1000:
            raise ValueError(f"concurrency must be an integer from 1 to 1000, got {concurrency!r}")
        return concurrency


#: TCP keepalives, so that a silently dead connection (a LISTEN waiting for news) is noticed.
_KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                               "keepalives_count": 3}
