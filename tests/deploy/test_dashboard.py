"""deploy/dashboards/cloister.json: it parses, and its PromQL names only real series."""

from __future__ import annotations

import json
import re

from tests.deploy.render import DEPLOY
from tests.utils.tier_samples import HOST_TIER

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
# The KV tiers under the device pool (issue 41): their own series and vLLM's names for them,
# which the gateway and an engine server both export (operators only on the gateway).
TIER_SERIES = {
    "cloister:kv_tier_blocks",
    "cloister:kv_tier_bytes",
    "cloister:kv_tier_capacity_bytes",
    "cloister:kv_tier_lookups_total",
    "cloister:kv_tier_hits_total",
    "cloister:kv_tier_loads_total",
    "cloister:kv_tier_write_backs_total",
    "cloister:kv_tier_recomputed_instead_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_total_bytes_total",
}


def promql_metrics(expr: str) -> set[str]:
    """Series names in a PromQL expression: tokens before a selector `{`, and prefixed ones."""
    names = set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", expr))
    names |= set(re.findall(r"\b(vllm:[a-z0-9_]+|cloister[_:][a-z0-9_]+)", expr))
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

    tier = HOST_TIER
    spec = SpecDecodeStats(1, 2, 1, (1, 0))
    stats = EngineStats(0, 0, 0.0, 0, 0, 0, 8, 16, spec_decode=spec, kv_tiers=(tier,))
    text = EngineMetrics(SimpleNamespace(stats=lambda: stats), "m").render()[0].decode()
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if not ln.startswith("#")}


def test_the_engine_series_are_what_an_engine_server_exports() -> None:
    assert engine_server_series() >= ENGINE_SERIES


def test_both_ends_export_the_kv_tier_series() -> None:
    """The tiers' series, vLLM's names included, on an engine server's /metrics (which the
    dashboard's KV tier panels read) and on the gateway's (an in-process engine's)."""
    assert engine_server_series() >= TIER_SERIES, TIER_SERIES - engine_server_series()
    assert gateway_registry_series() >= TIER_SERIES, TIER_SERIES - gateway_registry_series()


def test_dashboard_names_only_existing_metrics() -> None:
    dashboard = json.loads((DEPLOY / "dashboards" / "cloister.json").read_text())
    assert gateway_registry_series() >= GATEWAY_SERIES
    known = GATEWAY_SERIES | ENGINE_SERIES | TIER_SERIES
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
        "cloister:kv_tier_blocks",
        "cloister:kv_tier_bytes",
        "cloister:kv_tier_capacity_bytes",
        "cloister:kv_tier_hits_total",
        "cloister:kv_tier_lookups_total",
        "cloister:kv_tier_loads_total",
        "cloister:kv_tier_write_backs_total",
        "cloister:kv_tier_recomputed_instead_total",
        "vllm:kv_offload_load_bytes_total",
        "vllm:kv_offload_store_bytes_total",
    ):
        assert wanted in used, wanted
    tenant = next(v for v in dashboard["templating"]["list"] if v["name"] == "tenant")
    assert tenant["query"]["query"] == "label_values(cloister_requests_total, tenant)"
    assert any('tenant=~"$tenant"' in e for e in exprs)


def test_dashboard_layout() -> None:
    """Panel ids are unique, no two panels overlap on Grafana's 24-column grid, every
    query panel and target reads the `datasource` variable, and the KV tiers have a row."""
    dashboard = json.loads((DEPLOY / "dashboards" / "cloister.json").read_text())
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            ds = {"type": "prometheus", "uid": "${datasource}"}
            assert p["datasource"] == ds, p["title"]
            assert p["targets"] and all(t["datasource"] == ds for t in p["targets"]), p["title"]
    rows = [p for p in panels if p["type"] == "row"]
    tiers = [r for r in rows if r["title"] == "KV tiers"]
    assert len(tiers) == 1, [r["title"] for r in rows]
    top = tiers[0]["gridPos"]["y"]
    below = min((r["gridPos"]["y"] for r in rows if r["gridPos"]["y"] > top), default=10**6)
    in_row = [p for p in panels if top < p["gridPos"]["y"] < below]
    assert len(in_row) >= 4
    exprs = [t["expr"] for p in in_row for t in p["targets"]]
    assert all("kv_tier" in e or "kv_offload" in e for e in exprs), exprs
