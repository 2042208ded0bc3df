"""The producer's trace context, carried in a job's ``meta`` (pgq.jobs.meta).

When opentelemetry-api is installed and the caller of ``enqueue`` / ``enqueue_many`` has a valid
current span, ``inject`` adds the W3C trace context (``traceparent`` and, when there is one,
``tracestate``; OpenTelemetry's TraceContextTextMapPropagator) under ``meta["otel"]``. The W3C
propagator is used whatever global propagator the application set: the stored format is one
any worker (Go, Node, ...) can read. A caller's own ``"otel"`` key is never overwritten; a meta
that is not a dict is left alone (the server refuses it). ``enqueue(..., trace_context=False)``
writes nothing.

The worker (pgq_thin.worker.tracing) reads it back with ``extract`` and gives each attempt's
span a Link to the producer's span: a link, not a parent, as an attempt may run hours later and
more than once. Without opentelemetry-api both are no-ops.
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["KEY", "extract", "inject"]

#: The key of ``meta`` that holds the trace context.
KEY = "otel"


@cache
def _otel() -> tuple[Any, Any] | None:
    """(opentelemetry.trace, a W3C propagator), or None without opentelemetry-api (imported once)."""
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return trace, TraceContextTextMapPropagator()


def inject(meta: Any) -> Any:
    """``meta`` with the current span's W3C context under ``"otel"`` (a new dict; ``meta`` itself
    is not changed), or ``meta`` as it is: no opentelemetry-api, no valid current span, a meta
    that is not a dict or None, or one that has an ``"otel"`` key already."""
    if meta is not None and (type(meta) is not dict or KEY in meta):
        return meta
    otel = _otel()
    if otel is None:
        return meta
    trace, propagator = otel
    if not trace.get_current_span().get_span_context().is_valid:
        return meta
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    if not carrier:
        return meta
    return {**(meta or {}), KEY: carrier}


def extract(meta: Any) -> Any:
    """The producer's SpanContext stored in ``meta["otel"]``, or None (none stored, not valid,
    or no opentelemetry-api)."""
    if type(meta) is not dict:
        return None
    carrier = meta.get(KEY)
    if type(carrier) is not dict:
        return None
    otel = _otel()
    if otel is None:
        return None
    trace, propagator = otel
    context = propagator.extract({k: v for k, v in carrier.items() if type(v) is str})
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None
