"""GET /engines with KV tiers under an engine's device pool (issue 41): each tier's
medium, blocks and bytes held and capacity, hit rate over its lookups, loads,
write-backs and blocks recomputed instead, as the engine reports them; no `kv_tiers`
where no tier is on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine_hop.in_process import InProcessEngineClient
from tests.admin.engine_stand_ins import FixedStatsEngine, connect_engines, idle_stats
from tests.utils.admin_env import AdminEnv, make_env
from tests.utils.tier_samples import HOST_TIER

P = "/admin/api/v1"
HOST = replace(HOST_TIER, lookups=8, hits=6, expirations=2)
DISK = replace(HOST, medium="DISK", capacity_blocks=400, blocks=30, lookups=0, hits=0)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AdminEnv]:
    """The admin app."""
    e = make_env(tmp_path)
    yield e
    e.client.close()


def test_each_tier_is_listed_with_its_figures(env: AdminEnv) -> None:
    engines = {
        "tiered": InProcessEngineClient(FixedStatsEngine(idle_stats(kv_tiers=(HOST, DISK)))),
        "plain": InProcessEngineClient(FixedStatsEngine(idle_stats())),
    }
    connect_engines(env, engines)
    r = env.client.get(f"{P}/engines", headers=env.token("viewer"))
    assert r.status_code == 200, r.text
    models = {m["model"]: m["replicas"] for m in r.json()["models"]}
    [tiered] = models["tiered"]
    host, disk = tiered["kv_tiers"]
    assert host == {
        "medium": "CPU_HOST",
        "blocks": 10,
        "capacity_blocks": 100,
        "bytes": 10 * 4096,
        "capacity_bytes": 100 * 4096,
        "lookups": 8,
        "hits": 6,
        "hit_rate": 0.75,
        "hit_blocks": 12,
        "loads": 9,
        "write_backs": 20,
        "recomputed_instead": 3,
        "evictions": 1,
        "expirations": 2,
    }
    # No lookup has gone on into the disk tier yet: no rate rather than a zero.
    assert (disk["medium"], disk["capacity_bytes"], disk["hit_rate"]) == ("DISK", 400 * 4096, None)
    [plain] = models["plain"]
    assert "kv_tiers" not in plain  # an engine without tiers answers as before
