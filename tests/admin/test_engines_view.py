"""GET /engines: one row per engine replica, in-process and remote, with the pool's
capacity, load and cache counters; not connected on an admin app without a gateway."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from admin.served_models import ServedModel, record_served
from engine.kv_cache.counters import DomainCacheStats
from engine_hop.in_process import InProcessEngineClient
from tests.admin.engine_stand_ins import (
    SPECULATIVE_FIGURES,
    FixedStatsEngine,
    connect_engines,
    idle_stats,
    remote_engine_server,
)
from tests.utils.admin_env import AdminEnv, make_env

P = "/admin/api/v1"


def local_engine() -> FixedStatsEngine:
    """Two running, one waiting, 3 of 8 looked-up tokens hit, 2 published blocks."""
    return FixedStatsEngine(
        idle_stats(
            num_running=2,
            num_waiting=1,
            kv_cache_usage=0.25,
            prefix_cache_queries=8,
            prefix_cache_hits=3,
            prefix_cache_domains={"<public>": DomainCacheStats(0, 0, 0, 0, 0, cached_blocks=2)},
        )
    )


def _engine_server(running: int) -> tuple[ThreadingHTTPServer, str]:
    """An engine server with `running` sequences running and 4 waiting."""
    return remote_engine_server(
        {
            "num_running": running,
            "num_waiting": 4,
            "kv_cache_usage": 0.5,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "num_preemptions": 0,
        }
    )


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AdminEnv]:
    """The admin app with model `local` recorded as loaded on cpu in float32."""
    e = make_env(tmp_path)
    served = ServedModel("local", str(tmp_path), "gguf", 64, "rev1", device="cpu", dtype="float32")
    record_served(e.sessions, e.services.audit_writer, served)
    yield e
    e.client.close()


def test_engines_without_a_gateway_are_not_connected(env: AdminEnv) -> None:
    """`cloister admin serve` has no engines: the page says so instead of showing zeros."""
    r = env.client.get(f"{P}/engines", headers=env.token("viewer"))
    assert r.status_code == 200
    assert r.json() == {"connected": False, "models": []}


def test_engines_lists_in_process_and_each_remote_replica(env: AdminEnv) -> None:
    """An in-process engine with the registry's device and dtype; a replica set's two
    engine servers as two rows, their pool from /internal/info, load from the poll."""
    servers = [_engine_server(running=1), _engine_server(running=5)]
    try:
        local = InProcessEngineClient(local_engine())
        connect_engines(env, {"local": local}, [url for _, url in servers])
        r = env.client.get(f"{P}/engines", headers=env.token("operator"))
    finally:
        for srv, _ in servers:
            srv.shutdown()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["connected"] is True
    assert [m["model"] for m in body["models"]] == ["local", "remote"]
    [local] = body["models"][0]["replicas"]
    assert local == {
        "replica": "in-process",
        "alive": True,
        "device": "cpu",
        "dtype": "float32",
        "num_blocks": 40,
        "block_size": 16,
        "kv_capacity_tokens": 640,
        "num_running": 2,
        "num_waiting": 1,
        "num_batch_running": 0,
        "num_batch_waiting": 0,
        "kv_cache_usage": 0.25,
        "prefix_cache_queries": 8,
        "prefix_cache_hits": 3,
        "prefix_hit_rate": 0.375,
        "public_cached_blocks": 2,
        "speculative": None,  # the engine does not speculate
    }
    replicas = body["models"][1]["replicas"]
    assert sorted(x["replica"] for x in replicas) == sorted(url for _, url in servers)
    assert sorted(x["num_running"] for x in replicas) == [1, 5]
    for x in replicas:
        assert (x["kv_capacity_tokens"], x["num_waiting"], x["alive"]) == (800, 4, True)
        # A remote engine's device is not known here, and no lookup means no hit rate.
        assert (x["device"], x["prefix_hit_rate"], x["public_cached_blocks"]) == (None, None, None)
        assert x["speculative"] is None  # its stats carry no speculation


def test_the_engines_view_shows_the_batch_share_of_running_and_waiting(
    env: AdminEnv,
) -> None:
    """GET /engines: of the running and waiting requests, the batch class's (Batch API
    lines, service_tier flex), as the engine counts them."""
    e = env
    stats = idle_stats(num_running=3, num_waiting=5, num_batch_running=2, num_batch_waiting=4)
    local = InProcessEngineClient(FixedStatsEngine(stats))
    connect_engines(e, {"local": local})
    r = e.client.get(f"{P}/engines", headers=e.token("viewer"))
    assert r.status_code == 200, r.text
    [replica] = r.json()["models"][0]["replicas"]
    assert (replica["num_running"], replica["num_batch_running"]) == (3, 2)
    assert (replica["num_waiting"], replica["num_batch_waiting"]) == (5, 4)


def test_the_engines_view_shows_speculative_decoding_acceptance(env: AdminEnv) -> None:
    """GET /engines: a speculating engine's drafts, acceptance rate and mean accepted
    length (accepted drafts per verify row, plus the token the model adds); one that
    has not drafted yet has no rate rather than a zero."""
    from engine.speculative.stats import SpecDecodeStats

    e = env
    spec = SpecDecodeStats(
        num_drafts=8, num_draft_tokens=32, num_accepted_tokens=20, accepted_per_pos=(8, 6, 4, 2)
    )
    engines = {
        "local": InProcessEngineClient(FixedStatsEngine(idle_stats(spec_decode=spec))),
        "fresh": InProcessEngineClient(FixedStatsEngine(idle_stats(spec_decode=SpecDecodeStats()))),
    }
    connect_engines(e, engines)
    r = e.client.get(f"{P}/engines", headers=e.token("viewer"))
    assert r.status_code == 200, r.text
    models = {m["model"]: m["replicas"][0] for m in r.json()["models"]}
    assert models["local"]["speculative"] == SPECULATIVE_FIGURES
    fresh = models["fresh"]["speculative"]
    assert fresh["num_drafts"] == 0
    assert (fresh["acceptance_rate"], fresh["mean_accepted_length"]) == (None, None)
