"""OpenTelemetry: one span per request when something exports spans, none recorded otherwise."""

from __future__ import annotations

from pathlib import Path

import httpx
from opentelemetry.context import Context
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.tracing import extract_context, gateway_tracer, make_tracer_provider
from server.settings import Settings
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import start_gateway

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def test_one_span_per_request_under_the_callers_trace(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider("none", extra_processor=SimpleSpanProcessor(exporter))
    gw, stop = start_gateway(
        tmp_path, engine=gateway_test_engine(), limiter=MemoryLimiter(), tracer_provider=provider
    )
    try:
        key = gw.tenant("acme")
        r = httpx.post(
            gw.base_url + "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
            },
            headers={"Authorization": f"Bearer {key}", "traceparent": TRACEPARENT},
            timeout=60,
        )
        assert r.status_code == 200
    finally:
        stop()
    (span,) = exporter.get_finished_spans()
    assert span.name == "gen_ai.request"
    assert format(span.context.trace_id, "032x") == TRACE_ID
    attrs = dict(span.attributes or {})
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.usage.output_tokens"] == r.json()["usage"]["completion_tokens"]
    assert attrs["cloister.tenant_id"]


def test_without_an_exporter_spans_are_not_recorded_but_carry_the_trace() -> None:
    assert Settings().telemetry.otel_exporter == "none"
    tracer = gateway_tracer(make_tracer_provider("none"))
    span = tracer.start_span(
        "gen_ai.request", context=extract_context({"traceparent": TRACEPARENT})
    )
    assert not span.is_recording()
    assert format(span.get_span_context().trace_id, "032x") == TRACE_ID
    assert not tracer.start_span("x", context=Context()).is_recording()
    # With an exporter configured, spans record.
    console = make_tracer_provider("console")
    try:
        assert gateway_tracer(console).start_span("x").is_recording()
    finally:
        console.shutdown()
