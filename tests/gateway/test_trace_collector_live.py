"""A live gateway and `cloister engine serve` export one trace to an OTLP/HTTP collector.

The collector is a stub on loopback that takes POSTs at /v1/traces. Spans go as
protobuf when opentelemetry-exporter-otlp-proto-http is installed (decoded with
opentelemetry-proto), else as OTLP JSON (CLOISTER_OTEL_PROTOCOL=http/json).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.model.tokenizer import load_tokenizer
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from tenancy.limiter.memory import MemoryLimiter
from tests.gateway.engine_servers import SERVICE_TOKEN, spawn_engine, wait_ready
from tests.utils.live_gateway import start_gateway
from tests.utils.services import stop_process
from tests.utils.tiny_model import make_tiny_model_dir

HAS_PROTOBUF_EXPORTER = importlib.util.find_spec("opentelemetry.exporter") is not None and (
    importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
)
PROTOCOL = "http/protobuf" if HAS_PROTOBUF_EXPORTER else "http/json"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


@dataclass
class Collected:
    """One span as the collector decoded it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


@dataclass
class Collector:
    """What the stub received: content types, byte counts, decoded spans."""

    content_types: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    spans: list[Collected] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def receive(self, content_type: str, body: bytes) -> None:
        spans = decode(content_type, body)
        with self.lock:
            self.content_types.append(content_type)
            self.sizes.append(len(body))
            self.spans.extend(spans)

    def wait_for(self, name: str, timeout_s: float = 20.0) -> Collected:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s.name == name]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {name!r} span reached the collector: {self.spans}")


def decode(content_type: str, body: bytes) -> list[Collected]:
    """The spans of one ExportTraceServiceRequest (JSON or protobuf)."""
    if content_type.startswith("application/json"):
        request = json.loads(body)
    else:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        request = MessageToDict(message)
        # protobuf's JSON mapping spells bytes ids in base64; OTLP JSON in hex.
        for rs in request.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if k in s:
                            import base64

                            s[k] = base64.b64decode(s[k]).hex()
    out = []
    for rs in request["resourceSpans"]:
        resource = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
        service = resource["service.name"]["stringValue"]
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                out.append(
                    Collected(
                        service=service,
                        name=s["name"],
                        trace_id=s["traceId"],
                        span_id=s["spanId"],
                        parent_span_id=s.get("parentSpanId", ""),
                        attributes={a["key"]: a["value"] for a in s.get("attributes", [])},
                    )
                )
    return out


@pytest.fixture
def collector() -> Iterator[tuple[str, Collector]]:
    received = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's spelling)
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            received.receive(self.headers.get("content-type") or "", body)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_gateway_and_engine_server_spans_reach_the_collector_as_one_trace(
    tmp_path: Path, collector: tuple[str, Collector]
) -> None:
    endpoint, received = collector
    model_dir = make_tiny_model_dir(tmp_path / "model")
    otel = {
        "CLOISTER_OTEL_EXPORTER": "otlp",
        "CLOISTER_OTEL_ENDPOINT": endpoint,
        "CLOISTER_OTEL_PROTOCOL": PROTOCOL,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # the SDK's batch delay: export within 0.1 s
    }
    engine = spawn_engine(model_dir, tmp_path / "engine.log", env=otel)
    try:
        wait_ready(engine)
        client = RemoteEngineClient(
            engine.base_url,
            token=SERVICE_TOKEN,
            tokenizer=load_tokenizer(model_dir),
            info=fetch_info(engine.base_url, SERVICE_TOKEN),
        )
        (tmp_path / "gw").mkdir()
        gw, stop = start_gateway(
            tmp_path / "gw",
            engine=None,
            client=client,
            limiter=MemoryLimiter(),
            otel_exporter="otlp",
            otel_endpoint=endpoint,
            otel_protocol=PROTOCOL,
        )
        try:
            r = httpx.post(
                gw.base_url + "/v1/completions",
                json={"model": "tiny", "prompt": "hello there", "max_tokens": 5},
                headers={
                    "Authorization": f"Bearer {gw.tenant('acme')}",
                    "traceparent": TRACEPARENT,
                },
                timeout=60,
            )
            assert r.status_code == 200, r.text
        finally:
            stop()  # shuts the gateway's provider down: its batch is flushed
        engine_span = received.wait_for("engine.generate")
    finally:
        stop_process(engine.proc)
    gateway_span = received.wait_for("gen_ai.request")
    expected_type = "application/json" if PROTOCOL == "http/json" else "application/x-protobuf"
    assert set(received.content_types) == {expected_type}
    assert all(size > 0 for size in received.sizes)

    assert gateway_span.service == "cloister-gateway"
    assert engine_span.service == "cloister-engine"
    assert gateway_span.trace_id == engine_span.trace_id == TRACE_ID
    assert engine_span.parent_span_id == gateway_span.span_id
    assert gateway_span.parent_span_id == TRACEPARENT.split("-")[2]

    usage = r.json()["usage"]
    attrs = engine_span.attributes
    assert attrs["gen_ai.system"] == {"stringValue": "cloister"}
    assert attrs["gen_ai.request.model"] == {"stringValue": "tiny"}
    assert attrs["gen_ai.request.max_tokens"] == {"intValue": "5"}
    assert attrs["gen_ai.usage.input_tokens"] == {"intValue": str(usage["prompt_tokens"])}
    assert attrs["gen_ai.usage.output_tokens"] == {"intValue": str(usage["completion_tokens"])}
    assert "cloister.engine.queue_time_s" in attrs
    reasons = attrs["gen_ai.response.finish_reasons"]["arrayValue"]["values"]
    assert [v["stringValue"] for v in reasons] == [r.json()["choices"][0]["finish_reason"]]
    assert gateway_span.attributes["gen_ai.operation.name"] == {"stringValue": "text_completion"}
