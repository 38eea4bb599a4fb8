"""The KV tiers under vLLM's names on an engine server's own /metrics (issue 41):
`vllm:external_prefix_cache_{queries,hits}` in tokens, `vllm:kv_offload_{load,store}_bytes`
and the older `vllm:kv_offload_total_bytes{transfer_type}`, with the values the gateway's
/metrics gives for the same stats (one function computes both), open like the rest of that
internal /metrics, and absent while no tier is on."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import generate_latest
from starlette.testclient import TestClient

from engine.stats import EngineStats
from engine_hop.in_process import InProcessEngineClient
from gateway.metrics import GatewayMetrics
from tests.admin.engine_stand_ins import FixedStatsEngine, idle_stats
from tests.utils.prometheus_text import labelled_samples
from tests.utils.tier_samples import HOST_TIER

TOKEN = "svc-token-for-the-kv-tier-metrics-test"
BLOCK = 16  # idle_stats' pool: 40 blocks of 16 tokens
HOST = HOST_TIER
DISK = replace(HOST, medium="DISK", bytes_per_block=8192, loads=2, write_backs=7, hit_blocks=2)
MODEL = 'model_name="remote"'
ALIASES = (
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_total_bytes_total",
)


def _engine_server_metrics(stats: EngineStats) -> str:
    """What a real engine server's GET /metrics answers for `stats`, asked with no
    credential (the route is open, as for the engine's other series)."""
    from engine_server.app import EngineServer
    from engine_server.auth import ServiceAuth
    from tests.utils.fast_fake_model import gateway_test_engine

    engine = gateway_test_engine()
    engine.stats = lambda: stats  # type: ignore[method-assign,assignment,return-value]
    app = EngineServer(engine, model_name="remote", auth=ServiceAuth(TOKEN)).app()
    with TestClient(app) as client:
        r = client.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


def _gateway_metrics(stats: EngineStats) -> str:
    """The gateway's operator /metrics text for an in-process engine reporting `stats`."""
    metrics = GatewayMetrics(model_name="remote", top_tenants=4)
    metrics.update_engine(InProcessEngineClient(FixedStatsEngine(stats)).stats())
    return generate_latest(metrics.tenant_registry).decode()


def test_an_engine_server_exports_the_tiers_under_vllm_names() -> None:
    # 1,000 prompt tokens looked up, 400 served from cache: of those, the 11 blocks the
    # tiers loaded (9 from host memory, 2 from disk), 176 tokens; the pool's own, 224.
    stats = idle_stats(prefix_cache_queries=1000, prefix_cache_hits=400, kv_tiers=(HOST, DISK))
    text = _engine_server_metrics(stats)
    assert labelled_samples(text, "vllm:external_prefix_cache_hits_total") == {MODEL: 11 * BLOCK}
    assert labelled_samples(text, "vllm:external_prefix_cache_queries_total") == {MODEL: 1000 - 224}
    assert labelled_samples(text, "vllm:kv_offload_load_bytes_total") == {
        MODEL: 9 * 4096 + 2 * 8192
    }
    # Only what the device pool wrote down (to host memory); disk writes come from there.
    assert labelled_samples(text, "vllm:kv_offload_store_bytes_total") == {MODEL: 20 * 4096}
    assert labelled_samples(text, "vllm:kv_offload_total_bytes_total") == {
        f'{MODEL},transfer_type="CPU_to_GPU"': 9 * 4096 + 2 * 8192,
        f'{MODEL},transfer_type="GPU_to_CPU"': 20 * 4096,
    }
    # The tiers' own series are there too, as before.
    assert labelled_samples(text, "cloister:kv_tier_loads_total")[f'{MODEL},tier="DISK"'] == 2
    # The gateway's /metrics gives the same figures for the same stats.
    gateway = _gateway_metrics(stats)
    for name in ALIASES:
        assert labelled_samples(text, name) == labelled_samples(gateway, name), name


def test_an_engine_without_a_block_size_gets_the_byte_figures_only() -> None:
    """As on the gateway: the token figures need the pool's block size."""
    text = _engine_server_metrics(idle_stats(block_size=0, kv_tiers=(HOST,)))
    assert labelled_samples(text, "vllm:kv_offload_load_bytes_total") == {MODEL: 9 * 4096}
    assert "vllm:external_prefix_cache" not in text


def test_no_vllm_tier_series_on_an_engine_server_while_no_tier_is_on() -> None:
    """As vLLM without a KV connector: no external or offload series at all, not zeros."""
    text = _engine_server_metrics(idle_stats(prefix_cache_queries=100, prefix_cache_hits=32))
    assert "vllm:prefix_cache_hits_total" in text
    for name in ("external_prefix_cache", "kv_offload", "kv_tier"):
        assert name not in text, name
