"""OpenTelemetry for the worker: when opentelemetry-api is installed, one span per job attempt
(kind CONSUMER, named ``process <queue>``), current while the handler runs, so the handler's own
spans nest under it. Attributes: ``pgq.job.id``, ``pgq.job.queue``, ``pgq.job.kind``,
``pgq.job.attempt`` and, at the end, ``pgq.job.outcome`` (the labels of
pgq_worker_jobs_total); also the messaging conventions' ``messaging.system`` ("pgq"),
``messaging.destination.name`` (the queue) and ``messaging.message.id``. An outcome other than
completed or snoozed sets the span's status to ERROR.

When the job's ``meta["otel"]`` holds the producer's trace context (``enqueue`` puts it there,
pgq_thin.tracecontext), the span has a Link to the producer's span, not a parent: an attempt may
run hours after the enqueue, and a retry links to the same producer again. ``pgq.job.linked``
says whether it has one.

Without opentelemetry-api, ``Tracing.create()`` is None and the worker does nothing for traces.
With the API but no tracer provider configured by the application (the global one not set, or
``Worker(tracer_provider=...)`` a no-op one), no span is started and a job costs next to nothing:
the global provider is looked at again at most once a second (UNSET_RECHECK), so one the
application sets while the worker runs is used from then on. Spans go
wherever the application's tracer provider sends them (the global one, or
``Worker(tracer_provider=...)``); pgq configures no exporter.
"""

from __future__ import annotations

import math
import time
from typing import Any

from pgq_thin import tracecontext
from pgq_thin.models import Job

__all__ = ["UNSET_RECHECK", "Tracing"]

#: While no global tracer provider is set, how often (seconds) the worker looks whether one is.
UNSET_RECHECK = 1.0
_PROVIDED = math.inf  # (the time of the next look, once there is a provider: never)

#: The outcomes whose span is not an error (a cancel, pgq.cancel, is an ending someone asked for).
_FINE = frozenset({"completed", "snoozed", "cancelled"})


class Tracing:
    """Opens and ends the span of each job attempt (``opentelemetry`` is imported by create())."""

    def __init__(self, trace: Any, context: Any, tracer_provider: Any = None) -> None:
        from pgq_thin import __version__

        self._trace = trace
        self._context = context
        self._tracer = trace.get_tracer("pgq_thin.worker", __version__, tracer_provider=tracer_provider)
        # The global provider is one of these until the application sets one (asking costs four
        # calls: not per job, but at most once per UNSET_RECHECK while it is unset).
        self._unset = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._check_at = 0.0 if tracer_provider is None else _PROVIDED  # when to look (time.monotonic())

    @classmethod
    def create(cls, tracer_provider: Any = None) -> Tracing | None:
        """A Tracing when opentelemetry-api is installed, else None. ``tracer_provider``: the
        provider to take the tracer from (None: the global one, as OpenTelemetry's own
        instrumentations do)."""
        try:
            from opentelemetry import context, trace
        except ImportError:
            return None
        if isinstance(tracer_provider, trace.NoOpTracerProvider):
            return None
        return cls(trace, context, tracer_provider)

    def start(self, job: Job) -> tuple[Any, Any] | None:
        """Open the attempt's span and make it current; the token to pass to end(). None when
        no tracer provider is configured (a span would be a no-op)."""
        check_at = self._check_at
        if check_at != _PROVIDED:
            if time.monotonic() < check_at:
                return None
            if isinstance(self._trace.get_tracer_provider(), self._unset):
                self._check_at = time.monotonic() + UNSET_RECHECK
                return None
            self._check_at = _PROVIDED  # a provider once set stays set
        producer = tracecontext.extract(job.meta) if job.meta is not None else None
        span = self._tracer.start_span(f"process {job.queue}", kind=self._trace.SpanKind.CONSUMER, attributes={
            "pgq.job.id": job.id, "pgq.job.queue": job.queue, "pgq.job.kind": job.kind,
            "pgq.job.attempt": job.attempt, "messaging.system": "pgq",
            "messaging.destination.name": job.queue, "messaging.message.id": str(job.id),
            "pgq.job.linked": producer is not None},
            links=None if producer is None else [self._trace.Link(producer)])
        token = self._context.attach(self._trace.set_span_in_context(span))
        return span, token

    def end(self, started: tuple[Any, Any], outcome: str) -> None:
        span, token = started
        span.set_attribute("pgq.job.outcome", outcome)
        if outcome not in _FINE:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome))
        try:
            self._context.detach(token)
        finally:
            span.end()
