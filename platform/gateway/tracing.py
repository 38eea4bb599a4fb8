"""OpenTelemetry for the gateway: a tracer the app owns, W3C trace context from headers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ExporterName = Literal["none", "console", "otlp"]
_PROPAGATOR = TraceContextTextMapPropagator()


def make_tracer_provider(
    exporter: ExporterName = "none", *, extra_processor: SpanProcessor | None = None
) -> TracerProvider:
    """A provider private to one app (never the global one). Exports nothing by default.

    With nothing to export to, spans are not recorded at all (a non-recording span
    still carries the incoming trace context): recording them would cost every
    request attribute bookkeeping that nobody reads.
    """
    recording = exporter != "none" or extra_processor is not None
    provider = TracerProvider() if recording else TracerProvider(sampler=ALWAYS_OFF)
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        # Optional dependency: only needed when someone turns the exporter on.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    return provider


def gateway_tracer(provider: TracerProvider) -> Tracer:
    """The tracer the request spans come from."""
    return provider.get_tracer("cloister.gateway")


def extract_context(headers: Mapping[str, str]) -> Context:
    """The parent context named by an incoming `traceparent` header (empty when absent)."""
    if "traceparent" not in headers:
        return Context()  # the common case: skip copying the headers for the propagator
    return _PROPAGATOR.extract(carrier=dict(headers))
