"""What Worker and AsyncWorker share before they connect: their settings, checked once, and the
registration of handlers, middleware and hooks."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar, overload

import psycopg.conninfo

from pgq_thin.calls import READING
from pgq_thin.client import resolve_dsn
from pgq_thin.durations import Interval, to_timedelta
from pgq_thin.encryption import key_ring
from pgq_thin.errors import PgqError
from pgq_thin.models import QueueStatus
from pgq_thin.tasks import Task, default_kind
from pgq_thin.worker.context import Handler
from pgq_thin.worker.metrics import JobWatch, WorkerMetrics, check_port, check_token
from pgq_thin.worker.middleware import Hook, Middleware, check_registration
from pgq_thin.worker.prefetch import check_prefetch
from pgq_thin.worker.support import KEEPALIVES, MAX_SECONDS, Flags, default_name, log, sane_seconds, seconds
from pgq_thin.worker.tracing import Tracing

__all__ = ["POOLED_POLL_INTERVAL", "WorkerBase"]

#: How often a pooled worker (no LISTEN) polls when poll_interval is not given.
POOLED_POLL_INTERVAL = 0.25
DAY = 86400.0

_H = TypeVar("_H", bound=Handler)
_M = TypeVar("_M", bound=Middleware)
_K = TypeVar("_K", bound=Hook)
_R = TypeVar("_R")


def check_queues(queues: Sequence[str] | str | None) -> list[str] | None:
    """A list of queue names; a string is split on commas; None means every queue."""
    if queues is None:
        return None
    names: Iterable[str] = queues.split(",") if isinstance(queues, str) else queues
    cleaned = [q.strip() for q in names if q and q.strip()]
    if not cleaned:
        raise ValueError("queues must name at least one queue (or be None for all queues)")
    return cleaned


def check_seconds(name: str, value: Any, low: float, high: float, low_included: bool = False) -> float | timedelta:
    """A setting that is an interval: a number of seconds, a timedelta or a duration as the CLI
    reads it (``"30s"``, ``"3m 12s"``: pgq_thin.durations; a bare ``"5"`` is refused); finite,
    within its range. Returns it converted: a duration in text becomes a timedelta."""
    if isinstance(value, str):
        try:
            value = to_timedelta(value)
        except ValueError as exc:
            raise ValueError(f"{name} {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"{name} must be a number of seconds, a timedelta or a duration such as '30s', "
                        f"got {type(value).__name__}")
    if not sane_seconds(value, low, high, low_included):
        above = "" if low == -math.inf else f"{'at least' if low_included else 'more than'} {low:g} and "
        raise ValueError(f"{name} must be a finite number of seconds, {above}at most {high:g}, got {value!r}")
    return value


def check_interval(name: str, value: Any, low: float, high: float, low_included: bool = False) -> float:
    """check_seconds, as a number of seconds (the settings the runtime computes with)."""
    return seconds(check_seconds(name, value, low, high, low_included))


def check_concurrency(concurrency: int) -> int:
    if not isinstance(concurrency, int) or concurrency < 1 or concurrency > 1000:
        raise ValueError(f"concurrency must be an integer from 1 to 1000, got {concurrency!r}")
    return concurrency


class WorkerBase:
    """The settings and handlers of a worker (see Worker for what each setting means)."""

    def __init__(
        self,
        queues: Sequence[str] | str | None = ("default",),
        concurrency: int = 4,
        *,
        name: str | None = None,
        lease: Interval | None = None,
        poll_interval: Interval | None = None,
        listen: bool = True,
        pooled: bool = False,
        sweep_interval: Interval = 30.0,
        heartbeat_interval: Interval = 10.0,
        shutdown_timeout: Interval = 30.0,
        prefetch: int | str = "auto",
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        metrics_token: str | None = None,
        tracing: bool = True,
        tracer_provider: Any = None,
        keys: Mapping[str, bytes] | None = None,
        encrypt_with: str | None = None,
    ) -> None:
        #: The key ring of ``keys`` and ``encrypt_with`` (None: no encryption): docs/encryption.md.
        self.keyring = key_ring(keys, encrypt_with)
        if poll_interval is not None:
            poll_interval = check_interval("poll_interval", poll_interval, 0, DAY)
        if lease is not None:
            lease = check_seconds("lease", lease, 0, MAX_SECONDS)  # its range: the server's
        sweep_interval = check_interval("sweep_interval", sweep_interval, -math.inf, DAY * 365)  # <= 0: never
        heartbeat_interval = check_interval("heartbeat_interval", heartbeat_interval, -math.inf, DAY)  # <= 0: never
        shutdown_timeout = check_interval("shutdown_timeout", shutdown_timeout, 0, DAY, low_included=True)
        self.queues = check_queues(queues)
        self.concurrency = check_concurrency(concurrency)
        self.prefetch = check_prefetch(prefetch)
        self.name = name or default_name()
        self.lease = lease
        self._poll_interval = poll_interval
        self.poll_interval = 1.0 if poll_interval is None else poll_interval
        self.listen = listen
        self.pooled = False
        if pooled:
            self._set_pooled()
        self.sweep_interval = sweep_interval
        self.heartbeat_interval = heartbeat_interval
        self.shutdown_timeout = shutdown_timeout
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.metrics_token = metrics_token
        self.tracing = tracing
        self.tracer_provider = tracer_provider
        self.metrics: WorkerMetrics | None = None  # while run() runs with a metrics_port
        self._handlers: dict[str, Handler] = {}
        self._middleware: list[Middleware] = []
        self._on_start: list[Hook] = []
        self._on_stop: list[Hook] = []
        self._ran = False
        self._flags = Flags()  # stop() before run() makes run() return at once
        self._listening = threading.Event()  # set while LISTEN works

    @property
    def metrics_port(self) -> int | None:
        """Where run() serves the worker's Prometheus metrics (http://metrics_host:port/metrics;
        0: a free port, see ``metrics.port``); None: no metrics (prometheus_client not imported)."""
        return self._metrics_port

    @metrics_port.setter
    def metrics_port(self, port: int | None) -> None:
        self._metrics_port = check_port(port)

    @property
    def metrics_token(self) -> str | None:
        """The bearer token a scrape of the worker's metrics needs (None: none)."""
        return self._metrics_token

    @metrics_token.setter
    def metrics_token(self, token: str | None) -> None:
        self._metrics_token = check_token(token)

    def _watch(self) -> JobWatch | None:
        """At the start of run(): the metrics (served from now on, and ``self.metrics``) and the
        spans, or None when neither is on."""
        self.metrics = None
        if self._metrics_port is not None:
            metrics = WorkerMetrics(self.concurrency)
            try:
                port = metrics.serve(self._metrics_port, self.metrics_host, self._metrics_token)
            except OSError as exc:
                raise PgqError(f"cannot serve the worker's metrics on {self.metrics_host}:{self._metrics_port}: "
                               f"{exc.strerror or exc}") from None
            log.info("worker %s serves its metrics on http://%s:%d/metrics", self.name, self.metrics_host, port,
                     extra={"worker": self.name})
            self.metrics = metrics
        return JobWatch.of(self.metrics, Tracing.create(self.tracer_provider) if self.tracing else None)

    def _unwatch(self) -> None:
        """At the end of run(): stop serving the metrics."""
        if self.metrics is not None:
            self.metrics.stop()

    @property
    def stopped_at_once(self) -> bool:
        """Whether the run ended by a stop at once (a second SIGTERM / SIGINT, or
        stop(graceful=False)): running jobs were left to their leases. ``pgq-thin worker`` then
        exits with status 1."""
        return self._flags.hard_stop.is_set()

    def handler(self, kind: str) -> Callable[[_H], _H]:
        """Register the decorated function for jobs of ``kind``; returns it unchanged."""

        def register(function: _H) -> _H:
            if kind in self._handlers:
                raise ValueError(f"a handler for kind {kind!r} is already registered")
            self._handlers[kind] = function
            return function

        return register

    @overload
    def task(self, function: Callable[..., _R], /) -> Task[_R]: ...

    @overload
    def task(self, function: None = None, /, *, queue: str | None = None, kind: str | None = None,
             **defaults: Any) -> Callable[[Callable[..., _R]], Task[_R]]: ...

    def task(self, function: Callable[..., _R] | None = None, /, *, queue: str | None = None,
             kind: str | None = None, **defaults: Any) -> Task[_R] | Callable[[Callable[..., _R]], Task[_R]]:
        """Register the decorated function as a task (pgq_thin.tasks.Task): a handler whose
        arguments are the payload's fields (a parameter named ``ctx`` gets the JobContext), and
        ``.enqueue(client_or_conn, **arguments)`` to send its jobs. ``queue``: where its jobs go
        (default: this worker's first queue, "default" for a worker of every queue); ``kind``:
        the function's ``__qualname__`` (without its ``<locals>.`` parts) unless given;
        ``defaults``: Client.enqueue's options for its jobs (``max_attempts``, ``priority``,
        ``unique_key`` (or a function of the task's arguments, by name, that returns it),
        ``max_run_time``...). ``@worker.task`` alone works too. An ``async def`` task needs an
        AsyncWorker. Returns the Task."""

        def register(fn: Callable[..., _R]) -> Task[_R]:
            check_registration("task", fn, type(self).__name__, self._ran, self._async_parts)
            name = kind if kind is not None else default_kind(fn)
            task = Task(fn, queue if queue is not None else (self.queues or ["default"])[0], name, defaults)
            self.handler(name)(task.handler())
            return task

        return register if function is None else register(function)

    #: Whether ``async def`` middleware and hooks are accepted (AsyncWorker).
    _async_parts = False

    def middleware(self, function: _M) -> _M:
        """Wrap every handler with ``function(job, ctx, call_next)``: ``call_next()`` runs the rest of
        the chain (the next middleware, at the end the handler) and returns its result (awaited, in
        an ``async def`` one on an AsyncWorker); what ``function`` returns is the handler's result,
        what it raises the job's outcome (Retry, Snooze, OutcomeUnknown included). The first
        registered is the outermost. On an AsyncWorker it may be an ``async def`` (run in the slot's
        task) or plain (run in a handler thread, as a plain handler is). Register before run();
        returns ``function`` unchanged, so it works as a decorator."""
        check_registration("middleware", function, type(self).__name__, self._ran, self._async_parts)
        self._middleware.append(function)
        return function

    def on_start(self, function: _K) -> _K:
        """Call ``function()`` once when a run starts, before it connects or claims anything (hooks
        in registration order). If one raises, run() raises it: nothing is claimed, and neither
        the later on_start hooks nor any on_stop hook runs. On an AsyncWorker it may be an
        ``async def`` (awaited) or plain (run in a thread). Register before run(); returns
        ``function`` unchanged (a decorator)."""
        check_registration("on_start", function, type(self).__name__, self._ran, self._async_parts)
        self._on_start.append(function)
        return function

    def on_stop(self, function: _K) -> _K:
        """Call ``function()`` once when a run whose on_start hooks succeeded ends (whatever ended
        it), after its jobs were recorded or given back and its connections closed (hooks in
        registration order). What one
        raises is logged, the others still run, and run() raises the first (unless the run is
        ending with an error of its own). Async or plain as on_start; register before run();
        returns ``function`` unchanged (a decorator)."""
        check_registration("on_stop", function, type(self).__name__, self._ran, self._async_parts)
        self._on_stop.append(function)
        return function

    def _stop_hook_failed(self, function: Hook, exc: BaseException) -> None:
        log.error("on_stop hook %s raised %r", getattr(function, "__qualname__", function), exc, exc_info=exc,
                  extra={"worker": self.name})

    @property
    def kinds(self) -> list[str]:
        """The kinds this worker has handlers for."""
        return sorted(self._handlers)

    @property
    def handlers(self) -> dict[str, Handler]:
        """The registered handlers by kind (a copy: register with ``handler``)."""
        return dict(self._handlers)

    def _set_pooled(self) -> None:
        """Behind a transaction-pooling proxy: no LISTEN (it needs a server connection of its own),
        no server-side prepared statements (connection_settings()), polling every
        POOLED_POLL_INTERVAL unless poll_interval was given."""
        self.pooled = True
        self.listen = False
        if self._poll_interval is None:
            self.poll_interval = POOLED_POLL_INTERVAL

    def connection_settings(self) -> dict[str, Any]:
        """The keyword arguments of the worker's pooled connections."""
        return {"autocommit": True, "application_name": f"pgq-worker {self.name}"[:63], "context": READING,
                **KEEPALIVES, **({"prepare_threshold": None} if self.pooled else {})}

    def _begin(self, dsn: str | None, queues: Sequence[str] | str | None, concurrency: int | None,
               prefetch: int | str | None, pooled: bool | None = None) -> str:
        """Check run()'s arguments and mark this worker as run; the database address to use."""
        kind = type(self).__name__
        if self._ran:
            raise RuntimeError(f"this {kind} has already run; create a new one")
        address = resolve_dsn(dsn)
        try:
            psycopg.conninfo.conninfo_to_dict(address)  # a malformed DSN fails here, not in a loop
        except psycopg.ProgrammingError as exc:
            raise PgqError(f"invalid database address: {str(exc).strip()}") from exc
        if queues is not None:
            self.queues = check_queues(queues)
        if concurrency is not None:
            self.concurrency = check_concurrency(concurrency)
        if prefetch is not None:
            self.prefetch = check_prefetch(prefetch)
        if pooled:
            self._set_pooled()
        self._ran = True
        if not self._handlers:
            log.warning("no handlers registered: this worker claims nothing (it claims only the kinds it "
                        "has handlers for)", extra={"worker": self.name})
        return address

    def _warn_about_queues(self, statuses: Sequence[QueueStatus]) -> None:
        for s in statuses:
            if not s.known:
                log.warning("queue %s does not exist (yet): nothing is claimed from it until a job is enqueued "
                            "there; is the name right?", s.queue, extra={"worker": self.name, "queue": s.queue})
            elif s.paused:
                log.warning("queue %s is paused: nothing is claimed from it until pgq.resume (pgq-thin resume %s)",
                            s.queue, s.queue, extra={"worker": self.name, "queue": s.queue})

    def _queues_not_checked(self, exc: Exception) -> None:
        log.debug("could not check the queues (%s)", exc, extra={"worker": self.name})

    def _started(self) -> None:
        log.info("worker %s started: queues %s, %d slots, %s", self.name,
                 ", ".join(self.queues) if self.queues else "(all)", self.concurrency,
                 "LISTEN and polling" if self.listen
                 else f"polling only (every {self.poll_interval:g} s{', pooled' if self.pooled else ''})",
                 extra={"worker": self.name, "queues": self.queues, "concurrency": self.concurrency})
