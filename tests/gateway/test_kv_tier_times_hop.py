"""The KV tiers' transfer times across the hop: an engine server's stats JSON, the
gateway's sum over replicas, and vLLM's `kv_offload_{load,store}_time` totals."""

from __future__ import annotations

import dataclasses

from engine_hop.client import EngineSnapshot, sum_kv_tiers
from engine_hop.remote_client import _tiers_from_json
from engine_hop.tier_metrics import tier_totals
from tests.utils.tier_samples import HOST_TIER

TIMED = dataclasses.replace(HOST_TIER, load_time_s=0.25, store_time_s=1.5)


def test_times_cross_the_stats_json() -> None:
    (back,) = _tiers_from_json([dataclasses.asdict(TIMED)])
    assert back == TIMED


def test_an_older_engine_without_times_still_reports_its_tiers() -> None:
    older = dataclasses.asdict(HOST_TIER)
    del older["load_time_s"], older["store_time_s"]
    (back,) = _tiers_from_json([older])
    assert back == HOST_TIER and back.load_time_s == 0.0


def test_replicas_times_add_up_and_export_as_vllm_totals() -> None:
    (summed,) = sum_kv_tiers([(TIMED,), (TIMED,)])
    assert (summed.load_time_s, summed.store_time_s) == (0.5, 3.0)
    snap = EngineSnapshot(0, 0, 0.0, 0, 0, 0, kv_tiers=(summed,), block_size=16)
    totals = tier_totals(snap)
    assert totals["kv_offload_load_time"] == 0.5
    assert totals["kv_offload_store_time"] == 3.0
