"""Logs, metrics and traces (`settings.telemetry`; CLOISTER_TELEMETRY__NAME or
CLOISTER_NAME)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TelemetrySettings(BaseModel):
    """How each service logs, what its metrics label, and where its traces go."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # DEBUG, INFO, WARNING, ERROR.
    log_level: str = "INFO"
    # "auto": readable lines on a terminal, JSON lines otherwise (pipes, files, collectors).
    log_format: Literal["auto", "console", "json"] = "auto"
    # An engine line (running, waiting, KV use, prefix hits, tokens/s) this often; 0: none.
    engine_log_interval_s: float = Field(default=10.0, ge=0.0, allow_inf_nan=False)
    # Tenants labelled by name in /metrics; the rest count as other.
    metrics_top_tenants: int = Field(default=20, ge=1)
    # Traces (server.telemetry): "otlp" sends them to an OpenTelemetry collector's OTLP/HTTP
    # endpoint (spans go to <endpoint>/v1/traces), as protobuf (needs the package
    # opentelemetry-exporter-otlp-proto-http) or as OTLP JSON (built in). The gateway's
    # service is named <service_name>-gateway, an engine server's <service_name>-engine.
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    # The collector's base URL.
    otel_endpoint: str = "http://127.0.0.1:4318"
    # How spans are encoded for the collector.
    otel_protocol: Literal["http/protobuf", "http/json"] = "http/protobuf"
    # The service name's stem in each span.
    otel_service_name: str = Field(default="cloister", min_length=1)
