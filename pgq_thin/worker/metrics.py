"""The worker's Prometheus metrics (``Worker(metrics_port=N)``, ``pgq-thin worker --metrics-port N``),
on a registry of their own, served over HTTP by prometheus_client:

- ``pgq_worker_jobs_total{queue,kind,outcome}``: job attempts this worker ran, by how they ended:
  ``completed``, ``failed`` (the handler raised, or there was no handler: pgq.fail, retried or not),
  ``snoozed``, ``outcome_unknown``, ``lease_lost`` (the job stopped being ours while it ran: its
  outcome was discarded), ``cancelled`` (pgq.cancel ended it while it ran, or before its slot
  started it: its outcome was discarded), ``interrupted`` (a stop at once cancelled an async handler).
- ``pgq_worker_job_duration_seconds{queue,kind}`` (histogram): how long the handler ran.
- ``pgq_worker_claim_batch_size`` (histogram): jobs each pgq.claim returned (0 for an empty claim).
- ``pgq_worker_leases_lost_total``: held jobs that stopped being ours (a renewal refused, renewals
  that failed until the lease was about to end, or
  max_run_time reached), not counting those cancelled (pgq.cancel: an expected end).
- ``pgq_worker_busy_slots``: slots running a handler now; ``pgq_worker_slots``: the concurrency.

prometheus_client is imported only when a metrics port is given: a worker without one imports
nothing and its parts only test ``metrics is None``. ``JobWatch`` is what the runtimes' executors
call around each handler: these metrics and, when opentelemetry-api is installed, the attempt's
span (pgq_thin.worker.tracing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pgq_thin.errors import PgqError
from pgq_thin.worker.held import Held
from pgq_thin.worker.outcomes import Outcome
from pgq_thin.worker.tracing import Tracing

__all__ = ["DURATION_BUCKETS", "JobWatch", "WorkerMetrics", "check_port", "check_token", "outcome_label"]

#: Handler run times, from a millisecond to ten minutes.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0, float("inf"))
#: Jobs per claim (a claim takes at most 1000).
BATCH_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, float("inf"))

_LABELS = {"complete": "completed", "fail": "failed", "snooze": "snoozed", "mark_unknown": "outcome_unknown",
           "park": "parked"}


def check_port(port: int | None) -> int | None:
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
        raise ValueError(f"metrics_port must be an integer from 0 to 65535 (0: any free port), got {port!r}")
    return port


def check_token(token: str | None) -> str | None:
    if token is not None and (not isinstance(token, str) or not token.strip() or token != token.strip()):
        raise ValueError("metrics_token must be a non-empty string without surrounding spaces, or None (no token)")
    return token


def outcome_label(held: Held, outcome: Outcome | None) -> str:
    """The ``outcome`` label of one handler run."""
    if held.ctx.completed:  # its ctx.transaction() committed: done, whatever the handler did afterwards
        return "completed"
    if held.ctx.parked:  # a durable wait ended the attempt in the database
        return "parked"
    if outcome is None:
        return "interrupted"
    if held.ctx.cancelled:
        return "cancelled"
    if held.ctx.is_lost():
        return "lease_lost"
    return _LABELS[outcome.operation]


class WorkerMetrics:
    """The metrics of one worker run, on their own prometheus_client registry."""

    def __init__(self, concurrency: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:
            raise PgqError("metrics_port needs prometheus_client: pip install 'pgq-thin[metrics]'") from exc
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.jobs = Counter("pgq_worker_jobs", "Job attempts this worker ran, by outcome.",
                            ["queue", "kind", "outcome"], registry=r)
        self.duration = Histogram("pgq_worker_job_duration_seconds", "How long the handler ran.",
                                  ["queue", "kind"], buckets=DURATION_BUCKETS, registry=r)
        self.claim_batch = Histogram("pgq_worker_claim_batch_size", "Jobs each claim returned.",
                                     buckets=BATCH_BUCKETS, registry=r)
        self.leases_lost = Counter("pgq_worker_leases_lost", "Held jobs that stopped being this worker's "
                                   "(a renewal refused, or max_run_time reached).", registry=r)
        self.busy = Gauge("pgq_worker_busy_slots", "Slots running a handler now.", registry=r)
        Gauge("pgq_worker_slots", "The worker's slots (its concurrency).", registry=r).set(concurrency)
        self._stop: Callable[[], None] | None = None
        self.port: int | None = None

    def claimed(self, jobs: int) -> None:
        self.claim_batch.observe(jobs)

    def lease_lost(self) -> None:
        self.leases_lost.inc()

    def serve(self, port: int, host: str, token: str | None = None) -> int:
        """Serve the registry on http://host:port/metrics (a daemon thread; pgq_thin.exporter's
        rules: loopback Host names when bound to loopback, /metrics only, ``token`` if given); the
        port bound (``port`` 0: a free one)."""
        from pgq_thin import exporter

        server, thread = exporter.serve(self.registry, port, host, token)
        self.port = int(server.server_address[1])

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        self._stop = stop
        return self.port

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None


class JobWatch:
    """What an executor calls around each handler run: ``started(held)`` before, and
    ``finished(token, held, outcome)`` after (outcome None: the run was cancelled). Counts into
    ``metrics`` and opens the attempt's span with ``tracing`` (either may be None)."""

    def __init__(self, metrics: WorkerMetrics | None, tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    @classmethod
    def of(cls, metrics: WorkerMetrics | None, tracing: Tracing | None) -> JobWatch | None:
        """A watch, or None when there is nothing to watch for (the executors then skip it)."""
        return cls(metrics, tracing) if metrics is not None or tracing is not None else None

    def started(self, held: Held) -> tuple[float, Any]:
        if self.metrics is not None:
            self.metrics.busy.inc()
        span = self.tracing.start(held.job) if self.tracing is not None else None
        return time.monotonic(), span

    def finished(self, token: tuple[float, Any], held: Held, outcome: Outcome | None) -> None:
        started, span = token
        metrics = self.metrics
        if metrics is None and span is None:
            return  # (tracing on, no tracer provider configured: nothing to count or end)
        label = outcome_label(held, outcome)
        if metrics is not None:
            job = held.job
            metrics.busy.dec()
            metrics.jobs.labels(job.queue, job.kind, label).inc()
            metrics.duration.labels(job.queue, job.kind).observe(time.monotonic() - started)
        if span is not None and self.tracing is not None:
            self.tracing.end(span, label)
