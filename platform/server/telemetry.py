"""Tracer providers for the services (gateway and engine server), built from settings.

Each app owns its provider (never the global one). `otlp` sends spans in batches to
an OpenTelemetry collector's OTLP/HTTP endpoint, as protobuf (the optional package
opentelemetry-exporter-otlp-proto-http) or as OTLP JSON (server.otlp_json, built in).
A missing package is a `TelemetryUnavailableError` at start-up, not at the first span.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Literal

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

if TYPE_CHECKING:
    from server.settings import Settings

ExporterName = Literal["none", "console", "otlp"]
OtlpProtocol = Literal["http/protobuf", "http/json"]
DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
PROTOBUF_EXPORTER = "opentelemetry.exporter.otlp.proto.http"


class TelemetryUnavailableError(ValueError):
    """The configured exporter cannot be built here (a package is missing)."""


def check_exporter(exporter: ExporterName, protocol: OtlpProtocol) -> None:
    """Raises `TelemetryUnavailableError` when `exporter`/`protocol` needs a missing package.

    Start-up commands call it before loading a model, so a typo costs no minutes."""
    if exporter != "otlp" or protocol != "http/protobuf":
        return
    if importlib.util.find_spec("opentelemetry.exporter") is None or (
        importlib.util.find_spec(PROTOBUF_EXPORTER) is None
    ):
        raise TelemetryUnavailableError(
            "CLOISTER_OTEL_EXPORTER=otlp with CLOISTER_OTEL_PROTOCOL=http/protobuf needs the "
            "package opentelemetry-exporter-otlp-proto-http, which is not installed; install "
            "it, or set CLOISTER_OTEL_PROTOCOL=http/json (OTLP JSON, built in)"
        )


def make_tracer_provider(
    exporter: ExporterName = "none",
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    protocol: OtlpProtocol = "http/protobuf",
    service_name: str = "cloister",
    extra_processor: SpanProcessor | None = None,
) -> TracerProvider:
    """A provider private to one app. Exports nothing by default.

    With nothing to export to, spans are not recorded at all (a non-recording span
    still carries the incoming trace context, and passes it on): recording them would
    cost every request attribute bookkeeping that nobody reads.
    """
    check_exporter(exporter, protocol)
    resource = Resource.create({"service.name": service_name})
    recording = exporter != "none" or extra_processor is not None
    provider = (
        TracerProvider(resource=resource)
        if recording
        else TracerProvider(resource=resource, sampler=ALWAYS_OFF)
    )
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(endpoint, protocol)))
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    return provider


def provider_from_settings(
    settings: Settings, *, role: str, extra_processor: SpanProcessor | None = None
) -> TracerProvider:
    """The provider of one service; `role` ("gateway", "engine") suffixes the service name."""
    return make_tracer_provider(
        settings.telemetry.otel_exporter,
        endpoint=settings.telemetry.otel_endpoint,
        protocol=settings.telemetry.otel_protocol,
        service_name=f"{settings.telemetry.otel_service_name}-{role}",
        extra_processor=extra_processor,
    )


def traces_url(endpoint: str) -> str:
    """The traces path under an OTLP/HTTP base endpoint (as OTEL_EXPORTER_OTLP_ENDPOINT)."""
    return endpoint.rstrip("/") + "/v1/traces"


def _otlp_exporter(endpoint: str, protocol: OtlpProtocol) -> SpanExporter:
    if protocol == "http/json":
        from server.otlp_json import OtlpJsonSpanExporter

        return OtlpJsonSpanExporter(traces_url(endpoint))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
        OTLPSpanExporter,
    )

    exporter: SpanExporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
    return exporter
