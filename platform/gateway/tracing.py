"""OpenTelemetry for the gateway: a tracer the app owns, W3C trace context both ways.

Incoming: `extract_context` reads a client's `traceparent`. Outgoing: the request's
span is made current around the engine submit (`RequestLifecycle.submit`), and a
remote engine client copies it into its request's headers (engine_hop.trace), so the
engine server's `engine.generate` span is a child of the gateway's.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from server.telemetry import ExporterName, make_tracer_provider

__all__ = [
    "ExporterName",
    "extract_context",
    "gateway_tracer",
    "make_tracer_provider",
]
_PROPAGATOR = TraceContextTextMapPropagator()


def gateway_tracer(provider: TracerProvider) -> Tracer:
    """The tracer the request spans come from."""
    return provider.get_tracer("cloister.gateway")


def extract_context(headers: Mapping[str, str]) -> Context:
    """The parent context named by an incoming `traceparent` header (empty when absent)."""
    if "traceparent" not in headers:
        return Context()  # the common case: skip copying the headers for the propagator
    return _PROPAGATOR.extract(carrier=dict(headers))
