"""Gateway with the Redis limiter; units: redaction, tenant-label bounding, trace context, serve."""

from __future__ import annotations

import io
import logging
import secrets
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio
from click.testing import CliRunner
from opentelemetry import trace

from engine_hop.client import EngineSnapshot
from engine_hop.replicas import IN_PROCESS, ReplicaState
from gateway.metrics import GatewayMetrics
from gateway.ratelimit_headers import format_duration
from gateway.tracing import extract_context
from server.logging_setup import configure_logging, redact
from tenancy.limiter.redis_limiter import RedisLimiter
from tests.utils.live_gateway import make_test_engine, start_gateway
from tests.utils.services import delete_prefix, redis_url

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.services
def test_redis_limiter_429_and_headers_through_gateway(tmp_path: Path) -> None:
    url = redis_url()  # skips, or fails under CLOISTER_REQUIRE_SERVICES=1
    prefix = f"cloister:test:{secrets.token_hex(4)}:"
    # The async client connects lazily, so it binds to the gateway's loop, not this thread.
    client = redis.asyncio.Redis.from_url(url)
    limiter = RedisLimiter(client, fail_mode="closed", local_cap_rpm=600, key_prefix=prefix)
    gw, stop = start_gateway(tmp_path, engine=make_test_engine(tmp_path), limiter=limiter)
    try:
        key = gw.tenant("acme", rpm=2)
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1}
        codes = []
        for _ in range(3):
            r = httpx.post(
                gw.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60
            )
            codes.append(r.status_code)
        assert codes == [200, 200, 429]
        assert r.headers["x-ratelimit-limit-requests"] == "2"
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        stop()  # the app's shutdown closes the limiter and its client
        with redis.Redis.from_url(url) as cleanup:
            delete_prefix(cleanup, prefix)


def test_redaction_masks_keys_and_authorization() -> None:
    key = "sk-clo-" + "A1b2" * 10
    assert key not in redact(f"calling with {key}")
    assert "Bearer abc" not in redact("Authorization: Bearer abcdef")
    stream = io.StringIO()
    handler = configure_logging("INFO", stream=stream)
    try:
        logging.getLogger("t").info("x", extra={"headers": {"authorization": key}, "note": key})
        logging.getLogger("t").info("args %s", key)
    finally:
        logging.getLogger().removeHandler(handler)
    assert key not in stream.getvalue() and "[REDACTED]" in stream.getvalue()


def test_tenant_labels_are_bounded() -> None:
    m = GatewayMetrics(model_name="m", top_tenants=2)
    for name in ("a", "b", "c", "d", "a"):
        m.observe_request(tenant=name, status=200, model="m")
    text = m.render(None, include_tenants=True).decode()  # what an operator scrapes
    assert 'tenant="a"} 2.0' in text and 'tenant="b"} 1.0' in text
    assert 'tenant="other"} 2.0' in text and 'tenant="c"' not in text


def test_engine_counters_advance_by_deltas() -> None:
    m = GatewayMetrics(model_name="m", top_tenants=2)
    m.render(EngineSnapshot(1, 2, 0.5, 100, 40, 1))
    text = m.render(EngineSnapshot(0, 0, 0.25, 150, 60, 1), include_tenants=True).decode()
    assert 'vllm:prefix_cache_queries_total{model_name="m"} 150.0' in text
    assert 'vllm:prefix_cache_hits_total{model_name="m"} 60.0' in text
    assert 'vllm:kv_cache_usage_perc{model_name="m"} 0.25' in text


def test_replica_series_are_operators_only_and_follow_the_set() -> None:
    m = GatewayMetrics(model_name="m", top_tenants=2)
    a, b = "http://10.0.0.1:8100", "http://10.0.0.2:8100"
    snap = EngineSnapshot(0, 0, 0.0, 0, 0, 0)
    up = ReplicaState(a, True, snap, in_process=False, in_flight=3)
    down = ReplicaState(b, False, snap, in_process=False, in_flight=0)
    local = ReplicaState(IN_PROCESS, True, snap, in_process=True)
    text = m.render(None, include_tenants=True, replicas={"m": [up, down], "n": [local]}).decode()
    assert f'cloister_engine_replica_up{{model_name="m",replica="{a}"}} 1.0' in text
    assert f'cloister_engine_replica_up{{model_name="m",replica="{b}"}} 0.0' in text
    assert f'cloister_engine_replica_in_flight{{model_name="m",replica="{a}"}} 3.0' in text
    assert IN_PROCESS not in text  # an in-process engine is no replica to watch
    assert "10.0.0" not in m.render(None, replicas={"m": [up, down]}).decode()  # anonymous
    # b's pod left the headless Service: its series go, not stay at their last value.
    text = m.render(None, include_tenants=True, replicas={"m": [up]}).decode()
    assert a in text and b not in text


def test_traceparent_is_extracted() -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    span = trace.get_current_span(extract_context({"traceparent": tp}))
    assert format(span.get_span_context().trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_reset_duration_format() -> None:
    assert format_duration(0.25) == "250ms"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(360) == "6m0s"


def test_serve_help_and_first_start_database(tmp_path: Path) -> None:
    from assembly.database import prepare_database
    from cloister.commands.serve import commands
    from server.settings import Settings

    result = CliRunner().invoke(commands[0], ["--help"])
    assert result.exit_code == 0 and "--redis-url" in result.output
    settings = Settings(data_dir=tmp_path / "data")
    assert prepare_database(settings) is True
    assert (tmp_path / "data" / "cloister.db").exists()
