"""deploy/dashboards/cloister.json: it parses, and its PromQL names only real series."""

from __future__ import annotations

import json
import re

from tests.deploy.render import DEPLOY

# Every series the dashboard may name: the gateway's (checked against its registry below)
# and the engine's (the vLLM names `cloister engine serve` exports).
GATEWAY_SERIES = {
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "cloister_requests_total",
    "cloister_limiter_rejections_total",
    "cloister_limiter_backend_errors_total",
    "cloister_engine_replica_up",
}
ENGINE_SERIES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:num_preemptions_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}


def promql_metrics(expr: str) -> set[str]:
    """Series names in a PromQL expression: tokens before a selector `{`, and prefixed ones."""
    names = set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", expr))
    names |= set(re.findall(r"\b(vllm:[a-z0-9_]+|cloister_[a-z0-9_]+)", expr))
    return names


def gateway_registry_series() -> set[str]:
    """The sample names the gateway's GatewayMetrics can expose."""
    from gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics(model_name="m", top_tenants=3)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for registry in (metrics.registry, metrics.tenant_registry)
        for family in registry.collect()
        for suffix in suffixes[family.type]
    }


def engine_server_series() -> set[str]:
    """The sample names an engine server's /metrics exposes (engine_server.metrics), for an
    engine that speculates and serves a KV tier (so that every optional family shows)."""
    from types import SimpleNamespace

    from engine.speculative.stats import SpecDecodeStats
    from engine.stats import EngineStats
    from engine_server.metrics import EngineMetrics

    stats = EngineStats(0, 0, 0.0, 0, 0, 0, 8, 16, spec_decode=SpecDecodeStats(1, 2, 1, (1, 0)))
    text = EngineMetrics(SimpleNamespace(stats=lambda: stats), "m").render()[0].decode()
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if not ln.startswith("#")}


def test_the_engine_series_are_what_an_engine_server_exports() -> None:
    assert engine_server_series() >= ENGINE_SERIES


def test_dashboard_names_only_existing_metrics() -> None:
    dashboard = json.loads((DEPLOY / "dashboards" / "cloister.json").read_text())
    assert gateway_registry_series() >= GATEWAY_SERIES
    known = GATEWAY_SERIES | ENGINE_SERIES
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"]
        for v in dashboard["templating"]["list"]
        if isinstance(v.get("query"), dict)
    ]
    assert len(exprs) > 15
    used: set[str] = set()
    for expr in exprs:
        names = promql_metrics(expr)
        assert names, expr
        assert names <= known, (expr, names - known)
        used |= names
    for wanted in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "cloister_engine_replica_up",
    ):
        assert wanted in used
    tenant = next(v for v in dashboard["templating"]["list"] if v["name"] == "tenant")
    assert tenant["query"]["query"] == "label_values(cloister_requests_total, tenant)"
    assert any('tenant=~"$tenant"' in e for e in exprs)
