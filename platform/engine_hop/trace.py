"""The W3C trace context (`traceparent`, `tracestate`) of the current span, for the
headers of a request to an engine server, so that its `engine.generate` span is a
child of the gateway's."""

from __future__ import annotations

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def trace_headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span; empty when there is none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier
