"""Per-tenant KV blocks in use and preemptions suffered and caused on /metrics: operator-only
tenant series, labelled by bounded tenant NAME (the engine reports "t:<tenant id>"),
counters advanced by deltas and safe across engine restarts; carried from an engine
server's /internal/stats and summed over a replica set's replicas (the replica set over
HTTP: tests/admin/test_tenant_kv_route.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from admin.identity import create_admin_token
from assembly.app import build_app
from engine.fronts.async_engine import AsyncEngine
from engine.stats import EngineStats, TenantKVStats
from engine_hop.client import EngineSnapshot, sum_tenant_kv
from engine_hop.in_process import InProcessEngineClient
from engine_hop.stats_json import tenant_kv_from_json, tenant_kv_to_json
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from gateway.metrics import OTHER_TENANT, GatewayMetrics
from server.settings import Settings
from tenancy import store
from tenancy.limiter.memory import MemoryLimiter
from tests.admin.engine_stand_ins import idle_stats
from tests.utils.built_app import prepared_sessions
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import OPERATOR_HEADERS, start_gateway
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir

TENANT = "initech-kv"


def _snap(**tenant_kv: tuple[int, int, int]) -> EngineSnapshot:
    """A snapshot whose per-tenant figures are (blocks, suffered, caused) per "t:<id>"."""
    return EngineSnapshot(
        0,
        0,
        0.0,
        0,
        0,
        0,
        tenant_kv={f"t:{k}": TenantKVStats(*v) for k, v in tenant_kv.items()},
    )


def _series(text: str, name: str) -> dict[tuple[str, str], float]:
    """`name`'s samples as (tenant, model_name) -> value."""
    out: dict[tuple[str, str], float] = {}
    pattern = rf'^{re.escape(name)}\{{model_name="([^"]*)",tenant="([^"]*)"\}} (\S+)$'
    for model, tenant, value in re.findall(pattern, text, re.M):
        out[(tenant, model)] = float(value)
    return out


BLOCKS = "cloister_tenant_kv_blocks_in_use"
SUFFERED = "cloister_tenant_preemptions_suffered_total"
CAUSED = "cloister_tenant_preemptions_caused_total"


def test_series_are_labelled_by_tenant_name_and_only_for_operators() -> None:
    m = GatewayMetrics(model_name="tiny", top_tenants=10)
    m.name_tenant("id1", "acme")
    snap = _snap(id1=(7, 2, 1), id9=(3, 0, 4))  # id9: never authenticated here
    public = m.render(snap).decode()
    assert "cloister_tenant_" not in public and "acme" not in public
    text = m.render(snap, include_tenants=True).decode()
    assert _series(text, BLOCKS) == {("acme", "tiny"): 7.0, ("id9", "tiny"): 3.0}
    assert _series(text, SUFFERED) == {("acme", "tiny"): 2.0, ("id9", "tiny"): 0.0}
    assert _series(text, CAUSED) == {("acme", "tiny"): 1.0, ("id9", "tiny"): 4.0}
    assert "t:id1" not in text and 'tenant="id1"' not in text


def test_counters_advance_by_deltas_and_survive_an_engine_restart() -> None:
    m = GatewayMetrics(model_name="tiny", top_tenants=10)
    m.name_tenant("a", "acme")
    m.name_tenant("b", "bravo")
    m.render(_snap(a=(4, 2, 0), b=(1, 0, 2)))
    m.render(_snap(a=(5, 5, 1), b=(1, 0, 2)))  # +3 suffered, +1 caused for acme
    text = m.render(_snap(a=(5, 5, 1), b=(1, 0, 2)), include_tenants=True).decode()
    assert _series(text, SUFFERED)[("acme", "tiny")] == 5.0
    assert _series(text, CAUSED)[("acme", "tiny")] == 1.0
    assert _series(text, CAUSED)[("bravo", "tiny")] == 2.0
    # The engine restarted: its counters start again from zero; what it counts since adds.
    text = m.render(_snap(a=(2, 1, 0)), include_tenants=True).decode()
    assert _series(text, SUFFERED)[("acme", "tiny")] == 6.0
    assert _series(text, CAUSED)[("bravo", "tiny")] == 2.0  # a counter never goes back
    # bravo is no longer reported: its gauge series is removed, not left stale.
    assert _series(text, BLOCKS) == {("acme", "tiny"): 2.0}
    # bravo comes back after the restart: its new count is counted from zero.
    text = m.render(_snap(a=(2, 1, 0), b=(0, 0, 3)), include_tenants=True).decode()
    assert _series(text, CAUSED)[("bravo", "tiny")] == 5.0
    assert _series(text, BLOCKS) == {("acme", "tiny"): 2.0, ("bravo", "tiny"): 0.0}


def test_tenant_labels_are_bounded_and_per_model() -> None:
    m = GatewayMetrics(model_name="a", top_tenants=1)
    for tid, name in (("1", "one"), ("2", "two"), ("3", "three")):
        m.name_tenant(tid, name)
    m.observe_request(tenant="one", status=200, model="a")  # takes the only kept name
    text = m.render(
        {"a": _snap(**{"1": (1, 0, 0), "2": (2, 1, 0), "3": (4, 1, 0)}), "b": _snap()},
        include_tenants=True,
    ).decode()
    # "two" and "three" share the "other" label: their blocks and preemptions add up.
    assert _series(text, BLOCKS) == {("one", "a"): 1.0, (OTHER_TENANT, "a"): 6.0}
    assert _series(text, SUFFERED) == {("one", "a"): 0.0, (OTHER_TENANT, "a"): 2.0}


def test_in_process_client_and_replica_set_carry_tenant_kv() -> None:
    stats = idle_stats(
        num_running=1,
        kv_cache_usage=0.1,
        num_preemptions=3,
        num_blocks=64,
        tenant_kv={"t:x": TenantKVStats(5, 3, 0)},
    )

    class Front:
        model_name, max_model_len, vocab_size, alive = "m", 64, 256, True

        def stats(self) -> EngineStats:
            return stats

    assert InProcessEngineClient(Front()).stats().tenant_kv == {  # type: ignore[arg-type]
        "t:x": TenantKVStats(5, 3, 0)
    }
    summed = sum_tenant_kv(
        [
            {"t:x": TenantKVStats(5, 3, 0)},
            {"t:x": TenantKVStats(1, 1, 2), "t:y": TenantKVStats(2, 0, 0)},
        ]
    )
    assert summed == {"t:x": TenantKVStats(6, 4, 2), "t:y": TenantKVStats(2, 0, 0)}


def test_engine_server_json_round_trip() -> None:
    report = {"t:a": TenantKVStats(3, 1, 0), "t:b": TenantKVStats(0, 0, 9)}
    assert tenant_kv_from_json(tenant_kv_to_json(report)) == report
    assert tenant_kv_from_json(None) == {}  # an engine server of before sends none
    with pytest.raises((KeyError, TypeError, ValueError)):
        tenant_kv_from_json({"t:a": {"blocks_in_use": 1}})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, AsyncEngine, str, dict[str, str]]]:
    """`cloister serve`'s app on the fast fake engine; one tenant, its key and operator tokens."""
    settings = Settings(
        data_dir=tmp_path, key_pepper=PEPPER, config_refresh_s=0.0, model_name="fake-model"
    )
    sessions = prepared_sessions(settings)
    tokens: dict[str, str] = {}
    with sessions() as s:
        tenant_id = store.create_tenant(s, name=TENANT).id
        tokens["key"] = store.create_key(s, tenant_name=TENANT, pepper=PEPPER).secret
        for role in ("admin", "viewer"):
            tokens[role] = create_admin_token(s, pepper=PEPPER, role=role).secret
    engine = gateway_test_engine()
    app = build_app(settings, engine=engine)
    try:
        with TestClient(app) as client:
            yield client, engine, tenant_id, tokens
    finally:
        app.state.metering.close()


def test_served_metrics_name_the_authenticated_tenant(
    served: tuple[TestClient, AsyncEngine, str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, engine, tenant_id, tokens = served
    kv = {
        f"t:{tenant_id}": TenantKVStats(
            blocks_in_use=3, preemptions_suffered=2, preemptions_caused=0
        )
    }
    monkeypatch.setattr(
        engine,
        "stats",
        lambda: EngineStats(1, 0, 0.1, 0, 0, 2, 64, 16, tenant_kv=kv),
    )
    r = client.post(
        "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {tokens['key']}"},
    )
    assert r.status_code == 200, r.text
    anonymous = client.get("/metrics").text
    assert "cloister_tenant_" not in anonymous and TENANT not in anonymous
    for role in ("admin", "viewer"):
        text = client.get("/metrics", headers={"Authorization": f"Bearer {tokens[role]}"}).text
        assert _series(text, BLOCKS) == {(TENANT, "fake-model"): 3.0}
        assert _series(text, SUFFERED) == {(TENANT, "fake-model"): 2.0}
        assert _series(text, CAUSED) == {(TENANT, "fake-model"): 0.0}
        assert tenant_id not in text


def test_a_real_engine_reports_named_tenants_preempted_under_a_small_pool(
    tmp_path: Path,
) -> None:
    """The tiny random-weight engine with a pool far too small for four long generations
    at once: it preempts, and the operators' /metrics name the tenants it counted."""
    folder = make_tiny_model_dir(tmp_path / "model")
    # 12 blocks of 16 tokens: one generation of ~170 tokens fits, four at once do not.
    engine = AsyncEngine.from_options(
        model=str(folder), max_model_len=192, num_blocks=12, attention_backend="torch"
    )
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())
    try:
        keys = {name: gw.tenant(name) for name in ("kv-alpha", "kv-bravo")}

        async def one(key: str) -> None:
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=120) as client:
                r = await client.post(
                    "/v1/completions",
                    json={
                        "model": "tiny",
                        "prompt": [5] * 20,
                        "max_tokens": 150,
                        "temperature": 0.0,
                        "ignore_eos": True,
                    },  # fmt: skip
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert r.status_code == 200, r.text

        async def load() -> None:
            await asyncio.gather(*(one(k) for k in keys.values() for _ in range(2)))

        asyncio.run(load())
        assert sum(s.preemptions_suffered for s in engine.stats().tenant_kv.values()) > 0
        public = httpx.get(gw.base_url + "/metrics").text
        assert "cloister_tenant_" not in public and "kv-alpha" not in public
        text = httpx.get(gw.base_url + "/metrics", headers=OPERATOR_HEADERS).text
        suffered = _series(text, SUFFERED)
        assert set(suffered) <= {(n, "tiny") for n in keys}, suffered  # names, never ids
        assert sum(suffered.values()) > 0
        # Nothing runs any more: the tenants still reported hold no block.
        assert set(_series(text, BLOCKS).values()) <= {0.0}
    finally:
        stop()


def test_the_engine_server_sends_tenant_kv_in_its_stats() -> None:
    """GET /internal/stats carries the engine's per-tenant figures for the remote client."""
    engine = gateway_test_engine()
    kv = {"t:abc": TenantKVStats(blocks_in_use=6, preemptions_suffered=1, preemptions_caused=2)}
    engine.stats = lambda: EngineStats(0, 0, 0.0, 0, 0, 1, 64, 16, tenant_kv=kv)  # type: ignore[method-assign,assignment]
    app = EngineServer(
        engine, model_name="fake-model", auth=ServiceAuth("svc-token-for-the-kv-test-0123")
    ).app()
    with TestClient(app) as client:
        r = client.get(
            "/internal/stats", headers={"Authorization": "Bearer svc-token-for-the-kv-test-0123"}
        )
    assert r.status_code == 200, r.text
    assert tenant_kv_from_json(r.json()["tenant_kv"]) == kv
