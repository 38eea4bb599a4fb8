"""Traces across the gateway -> engine server hop: one trace, the engine's span a child.

In one process (fast): an engine server app over the fast fake engine, reached by a gateway
through `RemoteEngineClient`, each with its own in-memory exporter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from server.otlp_json import encode_spans
from server.telemetry import TelemetryUnavailableError, check_exporter, make_tracer_provider
from tenancy.limiter.memory import MemoryLimiter
from tests.gateway.engine_servers import serve_in_thread
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

TOKEN = "svc-" + "trace-hop-token-for-tests-only"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Hop:
    """A gateway, an engine server, and the spans each exported."""

    def __init__(
        self,
        gw: LiveGateway,
        gateway: InMemorySpanExporter,
        engine: InMemorySpanExporter,
        client: RemoteEngineClient,
    ):
        self.gw, self.gateway_spans, self.engine_spans = gw, gateway, engine
        self.client = client

    def wait_engine_spans(self, count: int) -> tuple[ReadableSpan, ...]:
        """The engine's spans once `count` ended (the stream's end races the response)."""
        deadline = time.monotonic() + 10
        while len(self.engine_spans.get_finished_spans()) < count:
            assert time.monotonic() < deadline, "the engine span did not end"
            time.sleep(0.01)
        return self.engine_spans.get_finished_spans()


@pytest.fixture(scope="module", params=["link", "http"])
def hop(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Hop]:
    engine_exporter, gateway_exporter = InMemorySpanExporter(), InMemorySpanExporter()
    engine_provider = make_tracer_provider(
        "none", service_name="cloister-engine", extra_processor=SimpleSpanProcessor(engine_exporter)
    )
    engine = gateway_test_engine()
    server = EngineServer(
        engine,
        model_name="tiny",
        auth=ServiceAuth(TOKEN),
        tracer=engine_provider.get_tracer("cloister.engine"),
    )
    url, stop_engine = serve_in_thread(server.app())
    client = RemoteEngineClient(
        url,
        token=TOKEN,
        tokenizer=engine.tokenizer,
        info=fetch_info(url, TOKEN),
        poll_s=60,
        transport=request.param,
    )
    gateway_provider = make_tracer_provider(
        "none",
        service_name="cloister-gateway",
        extra_processor=SimpleSpanProcessor(gateway_exporter),
    )
    gw, stop_gateway = start_gateway(
        tmp_path_factory.mktemp("gw"),
        engine=None,
        client=client,
        limiter=MemoryLimiter(),
        tracer_provider=gateway_provider,
    )
    try:
        yield Hop(gw, gateway_exporter, engine_exporter, client)
    finally:
        stop_gateway()
        stop_engine()


def chat(hop: Hop, key: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "temperature": 0.0,
    }
    r = httpx.post(
        hop.gw.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


def test_the_engine_span_is_a_child_of_the_gateway_span_in_the_callers_trace(hop: Hop) -> None:
    hop.gateway_spans.clear()
    hop.engine_spans.clear()
    r = chat(hop, hop.gw.tenant("acme"), {"traceparent": TRACEPARENT})
    (gateway_span,) = hop.gateway_spans.get_finished_spans()
    (engine_span,) = hop.wait_engine_spans(1)
    assert format(gateway_span.context.trace_id, "032x") == TRACE_ID
    assert engine_span.context.trace_id == gateway_span.context.trace_id
    assert engine_span.parent is not None
    assert engine_span.parent.span_id == gateway_span.context.span_id
    assert engine_span.name == "engine.generate"
    assert engine_span.resource.attributes["service.name"] == "cloister-engine"
    assert gateway_span.resource.attributes["service.name"] == "cloister-gateway"

    usage = r.json()["usage"]
    attrs = dict(engine_span.attributes or {})
    assert attrs["gen_ai.system"] == "cloister"
    assert attrs["gen_ai.request.model"] == "tiny"
    assert attrs["gen_ai.request.max_tokens"] == 4
    assert attrs["gen_ai.request.temperature"] == 0.0
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 4
    assert attrs["cloister.engine.queue_time_s"] >= 0.0

    gw_attrs = dict(gateway_span.attributes or {})
    assert gw_attrs["gen_ai.system"] == "cloister"
    assert gw_attrs["gen_ai.operation.name"] == "chat"
    assert gw_attrs["gen_ai.request.model"] == "tiny"
    assert gw_attrs["gen_ai.request.max_tokens"] == 4
    assert gw_attrs["gen_ai.request.temperature"] == 0.0
    assert gw_attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert gw_attrs["gen_ai.usage.output_tokens"] == 4
    assert gw_attrs["gen_ai.response.id"] == r.json()["id"]


def test_without_a_caller_trace_the_gateway_starts_one_and_the_engine_joins_it(hop: Hop) -> None:
    hop.gateway_spans.clear()
    hop.engine_spans.clear()
    chat(hop, hop.gw.tenant("solo"))
    (gateway_span,) = hop.gateway_spans.get_finished_spans()
    (engine_span,) = hop.wait_engine_spans(1)
    assert gateway_span.parent is None
    assert engine_span.context.trace_id == gateway_span.context.trace_id
    assert engine_span.parent is not None
    assert engine_span.parent.span_id == gateway_span.context.span_id


def test_otlp_json_encoding_names_ids_in_hex_and_the_parent(hop: Hop) -> None:
    hop.gateway_spans.clear()
    hop.engine_spans.clear()
    chat(hop, hop.gw.tenant("enc"), {"traceparent": TRACEPARENT})
    (engine_span,) = hop.wait_engine_spans(1)
    body = json.loads(json.dumps(encode_spans([engine_span])))
    (resource,) = body["resourceSpans"]
    assert {"key": "service.name", "value": {"stringValue": "cloister-engine"}} in resource[
        "resource"
    ]["attributes"]
    (scope,) = resource["scopeSpans"]
    (span,) = scope["spans"]
    assert scope["scope"]["name"] == "cloister.engine"
    assert span["traceId"] == TRACE_ID
    assert span["parentSpanId"] == format(engine_span.parent.span_id, "016x")  # type: ignore[union-attr]
    assert span["kind"] == 2  # SERVER
    attrs = {a["key"]: a["value"] for a in span["attributes"]}
    assert attrs["gen_ai.usage.output_tokens"] == {"intValue": "4"}
    assert attrs["gen_ai.response.finish_reasons"] == {
        "arrayValue": {"values": [{"stringValue": "length"}]}
    }


@pytest.fixture
def no_protobuf_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protobuf exporter package looks missing, whether or not it is installed."""
    import importlib.util

    from server import telemetry

    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == telemetry.PROTOBUF_EXPORTER else real(name, package)

    monkeypatch.setattr(telemetry.importlib.util, "find_spec", find_spec)


def test_otlp_over_protobuf_is_refused_at_start_up_without_its_package(
    no_protobuf_exporter: None,
) -> None:
    check_exporter("otlp", "http/json")  # built in: always available
    check_exporter("none", "http/protobuf")
    with pytest.raises(TelemetryUnavailableError, match="opentelemetry-exporter-otlp-proto-http"):
        make_tracer_provider("otlp", protocol="http/protobuf")


def test_the_engine_serve_command_refuses_a_missing_exporter_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_protobuf_exporter: None
) -> None:
    from click.testing import CliRunner

    from cloister.cli import main

    monkeypatch.setenv("CLOISTER_OTEL_EXPORTER", "otlp")
    monkeypatch.setenv("CLOISTER_SERVICE_TOKEN", TOKEN)
    monkeypatch.setenv("CLOISTER_DEVICE", "cpu")
    result = CliRunner().invoke(main, ["engine", "serve", "--data-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "opentelemetry-exporter-otlp-proto-http" in result.output
    assert "CLOISTER_OTEL_PROTOCOL=http/json" in result.output


def test_finished_streams_give_their_connection_back_to_the_pool(hop: Hop) -> None:
    """The hop's cost: one connection serves request after request. Over HTTP, a stream
    read to its end is reused, and one dropped unread would cost the next request a new
    connection (bench/engine_hop.py measured about 2 ms each); the link keeps its one
    WebSocket open."""
    key = hop.gw.tenant("pool")
    for _ in range(3):
        chat(hop, key)
    connector = hop.client.stream_session().connector
    assert connector is not None
    # aiohttp's pool has no public count: `_acquired` holds the connections in use,
    # `_conns` the idle ones by host.
    idle = [c for conns in connector._conns.values() for c in conns]  # type: ignore[attr-defined]
    if hop.client.transport == "link":
        assert len(connector._acquired) == 1 and not idle  # type: ignore[attr-defined]
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and connector._acquired:  # type: ignore[attr-defined]
        time.sleep(0.01)  # the last stream's task reads the body's end after the reply
    assert not connector._acquired  # type: ignore[attr-defined]
    idle = [c for conns in connector._conns.values() for c in conns]  # type: ignore[attr-defined]
    assert len(idle) == 1  # the three streams took turns on one connection
