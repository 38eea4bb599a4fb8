"""The KV tiers under vLLM's names on `cloister serve`'s /metrics (issue 41): the KV
connector's `vllm:external_prefix_cache_{queries,hits}` in tokens and the offloading
connector's `vllm:kv_offload_{load,store}_bytes` (and the older
`vllm:kv_offload_total_bytes{transfer_type}`), for operators only like the tiers' own
`cloister:kv_tier_*` series, advanced by deltas, and absent while no tier is on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from admin.identity import create_admin_token
from assembly.app import build_app
from assembly.database import prepare_database
from engine.fronts.async_engine import AsyncEngine
from engine.kv_cache.host_tier import TierStats
from engine.stats import EngineStats
from server.settings import Settings
from tenancy.db import make_engine, make_session_factory
from tests.admin.engine_stand_ins import idle_stats
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine
from tests.utils.principals import PEPPER
from tests.utils.prometheus_text import labelled_samples
from tests.utils.tier_samples import HOST_TIER

BLOCK = 16  # idle_stats' pool: 40 blocks of 16 tokens
HOST = HOST_TIER
DISK = replace(HOST, medium="DISK", bytes_per_block=4096, loads=2, write_backs=7, hit_blocks=2)
MODEL = 'model_name="fake-model"'


class TieredEngine(AsyncEngine):
    """The real engine over the fast fake model, reporting whatever stats the test sets in `figures`."""

    figures: EngineStats = idle_stats()

    def stats(self) -> EngineStats:  # type: ignore[override]
        """The stats the test set last."""
        return self.figures


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, TieredEngine, str]]:
    """`cloister serve`'s app on the tiered engine; an admin token."""
    settings = Settings(
        data_dir=tmp_path, key_pepper=PEPPER, config_refresh_s=0.0, model_name="fake-model"
    )
    prepare_database(settings)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    with sessions() as s:
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
    engine = TieredEngine(fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS))
    app = build_app(settings, engine=engine)
    try:
        with TestClient(app) as client:
            yield client, engine, admin
    finally:
        app.state.metering.close()


def _scrape(client: TestClient, token: str | None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    return r.text


def test_vllm_tier_series_for_operators_with_vllm_units(
    served: tuple[TestClient, TieredEngine, str],
) -> None:
    client, engine, admin = served
    # 1,000 prompt tokens looked up, 400 served from cache: of those, the 11 blocks the
    # tiers loaded (9 from host memory, 2 from disk), 176 tokens; the pool's own, 224.
    engine.figures = idle_stats(
        prefix_cache_queries=1000, prefix_cache_hits=400, kv_tiers=(HOST, DISK)
    )
    text = _scrape(client, admin)
    assert labelled_samples(text, "vllm:external_prefix_cache_hits_total") == {MODEL: 11 * BLOCK}
    assert labelled_samples(text, "vllm:external_prefix_cache_queries_total") == {MODEL: 1000 - 224}
    assert labelled_samples(text, "vllm:kv_offload_load_bytes_total") == {MODEL: 11 * 4096}
    # Only what the device pool wrote down (to host memory); disk writes come from there.
    assert labelled_samples(text, "vllm:kv_offload_store_bytes_total") == {MODEL: 20 * 4096}
    assert labelled_samples(text, "vllm:kv_offload_total_bytes_total") == {
        f'{MODEL},transfer_type="CPU_to_GPU"': 11 * 4096,
        f'{MODEL},transfer_type="GPU_to_CPU"': 20 * 4096,
    }
    # The tier's own series are there too, as before.
    assert labelled_samples(text, "cloister:kv_tier_loads_total")[f'{MODEL},tier="CPU_HOST"'] == 9
    # Anonymous scrapes see none of it: these move with every tenant's traffic.
    anonymous = _scrape(client, None)
    for name in ("external_prefix_cache", "kv_offload", "kv_tier"):
        assert name not in anonymous, name
    assert "vllm:num_requests_running" in anonymous  # the public series are still served

    # More traffic: the counters advance by the change.
    engine.figures = idle_stats(
        prefix_cache_queries=1500,
        prefix_cache_hits=600,
        kv_tiers=(replace(HOST, loads=14, write_backs=30), DISK),
    )
    text = _scrape(client, admin)
    assert labelled_samples(text, "vllm:external_prefix_cache_hits_total") == {MODEL: 16 * BLOCK}
    assert labelled_samples(text, "vllm:external_prefix_cache_queries_total") == {
        MODEL: 1500 - (600 - 16 * BLOCK)
    }
    assert labelled_samples(text, "vllm:kv_offload_store_bytes_total") == {MODEL: 30 * 4096}
    # A restarted engine counts from zero: its whole value is added.
    engine.figures = idle_stats(
        prefix_cache_queries=100, prefix_cache_hits=32, kv_tiers=(replace(HOST, loads=1), DISK)
    )
    text = _scrape(client, admin)
    assert labelled_samples(text, "vllm:external_prefix_cache_hits_total") == {
        MODEL: 16 * BLOCK + 3 * BLOCK
    }


def test_no_vllm_tier_series_while_no_tier_is_on(
    served: tuple[TestClient, TieredEngine, str],
) -> None:
    """As vLLM without a KV connector: no external or offload samples at all, not zeros."""
    client, engine, admin = served
    engine.figures = idle_stats(prefix_cache_queries=100, prefix_cache_hits=32)
    text = _scrape(client, admin)
    assert "vllm:prefix_cache_hits_total" in text
    for name in (
        "vllm:external_prefix_cache_hits_total{",
        "vllm:external_prefix_cache_queries_total{",
        "vllm:kv_offload_load_bytes_total{",
        "vllm:kv_offload_total_bytes_total{",
    ):
        assert name not in text, name


def test_a_replica_set_sums_its_replicas_tiers_and_exports_them() -> None:
    """Two engine servers with L2 and L3: each /internal/stats carries its tiers, the
    gateway's replica set adds them medium by medium (they were dropped before), and the
    vLLM token series use the replicas' block size from /internal/info (the stats poll
    carries none)."""
    import dataclasses

    from gateway.metrics import GatewayMetrics, tier_totals
    from tests.admin.engine_stand_ins import REMOTE_INFO, polled_replica_set, remote_engine_server

    def body(tiers: tuple[TierStats, ...]) -> dict[str, object]:
        stats = idle_stats(kv_tiers=tiers)
        return {
            "num_running": 0,
            "num_waiting": 0,
            "kv_cache_usage": 0.0,
            "prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "num_preemptions": 0,
            "kv_tiers": [dataclasses.asdict(t) for t in tiers],
        }

    servers = [remote_engine_server(body((HOST, DISK))), remote_engine_server(body((HOST,)))]
    try:
        summed = polled_replica_set([url for _, url in servers]).stats()
    finally:
        for srv, _ in servers:
            srv.shutdown()
    host, disk = summed.kv_tiers
    assert (host.medium, disk.medium) == ("CPU_HOST", "DISK")
    assert (host.loads, host.write_backs, host.capacity_blocks) == (18, 40, 200)
    assert (disk.loads, disk.write_backs) == (2, 7)
    assert summed.block_size == REMOTE_INFO["block_size"]
    assert tier_totals(summed)["external_prefix_cache_hits"] == 20 * summed.block_size
    text = (
        GatewayMetrics(model_name="remote", top_tenants=4)
        .render({"remote": summed}, include_tenants=True)
        .decode()
    )
    assert 'vllm:kv_offload_load_bytes_total{model_name="remote"} 81920.0' in text
