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
With the API but no SDK configured by the application, the spans are the API's no-ops. Spans go
wherever the application's tracer provider sends them (the global one, or
``Worker(tracer_provider=...)``); pgq configures no exporter.
"""

from __future__ import annotations

from typing import Any

from pgq_thin import tracecontext
from pgq_thin.models import Job

__all__ = ["Tracing"]

_FINE = frozenset({"completed", "snoozed"})


class Tracing:
    """Opens and ends the span of each job attempt (``opentelemetry`` is imported by create())."""

    def __init__(self, trace: Any, context: Any, tracer_provider: Any = None) -> None:
        from pgq_thin import __version__

        self._trace = trace
        self._context = context
        self._tracer = trace.get_tracer("pgq_thin.worker", __version__, tracer_provider=tracer_provider)

    @classmethod
    def create(cls, tracer_provider: Any = None) -> Tracing | None:
        """A Tracing when opentelemetry-api is installed, else None. ``tracer_provider``: the
        provider to take the tracer from (None: the global one, as OpenTelemetry's own
        instrumentations do)."""
        try:
            from opentelemetry import context, trace
        except ImportError:
            return None
        return cls(trace, context, tracer_provider)

    def start(self, job: Job) -> tuple[Any, Any]:
        """Open the attempt's span and make it current; the token to pass to end()."""
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
