"""The KV tiers' series on /metrics: operators only, gauges set, counters advanced by
deltas and safe across an engine restart."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import generate_latest

from engine.kv_cache.host_tier import TierStats
from engine_hop.client import EngineSnapshot
from gateway.metrics import GatewayMetrics
from tests.utils.tier_samples import HOST_TIER

TIER = replace(HOST_TIER, expirations=2)


def _snap(tier: TierStats) -> EngineSnapshot:
    return EngineSnapshot(0, 0, 0.0, 0, 0, 0, kv_tiers=(tier,))


def _value(text: str, name: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + "{")]
    return float(line.rsplit(" ", 1)[1])


def test_tier_series_are_operator_only_and_advance_by_deltas() -> None:
    metrics = GatewayMetrics(model_name="tiny", top_tenants=4)
    metrics.update_engine(_snap(TIER))
    public = generate_latest(metrics.registry).decode()
    assert "kv_tier" not in public
    text = generate_latest(metrics.tenant_registry).decode()
    assert 'cloister:kv_tier_loads_total{model_name="tiny",tier="CPU_HOST"} 9.0' in text
    assert _value(text, "cloister:kv_tier_bytes") == 10 * 4096
    assert _value(text, "cloister:kv_tier_capacity_bytes") == 100 * 4096
    assert _value(text, "cloister:kv_tier_recomputed_instead_total") == 3
    metrics.update_engine(_snap(replace(TIER, loads=15, blocks=4)))
    text = generate_latest(metrics.tenant_registry).decode()
    assert _value(text, "cloister:kv_tier_loads_total") == 15
    assert _value(text, "cloister:kv_tier_blocks") == 4
    # A restarted engine counts from zero: its whole value is added.
    metrics.update_engine(_snap(replace(TIER, loads=2)))
    text = generate_latest(metrics.tenant_registry).decode()
    assert _value(text, "cloister:kv_tier_loads_total") == 17
    assert _value(text, "cloister:kv_tier_write_backs_total") == 20  # unchanged: no delta


def test_an_engine_server_exports_and_carries_its_tiers() -> None:
    from dataclasses import asdict
    from types import SimpleNamespace

    from engine_hop.remote_client import _tiers_from_json
    from engine_server.metrics import EngineMetrics
    from tests.admin.engine_stand_ins import idle_stats

    stats = idle_stats(num_blocks=8, kv_tiers=(TIER,))
    front = SimpleNamespace(stats=lambda: stats)
    text = EngineMetrics(front, "tiny").render()[0].decode()
    assert 'cloister:kv_tier_loads_total{model_name="tiny",tier="CPU_HOST"} 9.0' in text
    assert _value(text, "cloister:kv_tier_bytes") == 10 * 4096
    # /internal/stats carries them as JSON; what a gateway cannot read is left out.
    assert _tiers_from_json([asdict(TIER)]) == (TIER,)
    assert _tiers_from_json([{"medium": "x"}, "junk", asdict(TIER)]) == (TIER,)
    assert _tiers_from_json(None) == ()
