"""GET /tenants/{name}/kv: the tenant's KV blocks in use against each served model's pool,
its quota, and the preemptions its sequences suffered and caused; operators and viewers
read any tenant's, a tenant-admin only its own (another's is a 404)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from engine.stats import TenantKVStats
from engine_hop.in_process import InProcessEngineClient
from tenancy import store
from tests.admin.engine_stand_ins import (
    FixedStatsEngine,
    connect_engines,
    idle_stats,
    remote_engine_server,
)
from tests.utils.admin_env import AdminEnv, make_env

P = "/admin/api/v1"
TENANT, OTHER = "acme", "globex"


def local_engine(tenant_kv: dict[str, TenantKVStats]) -> FixedStatsEngine:
    """An in-process engine front with fixed stats: `tenant_kv` per fairness key."""
    stats = idle_stats(num_running=2, kv_cache_usage=0.25, num_preemptions=3, tenant_kv=tenant_kv)
    return FixedStatsEngine(stats)


def _engine_server(tenant_kv: dict[str, Any]) -> tuple[ThreadingHTTPServer, str]:
    """An engine server whose /internal/stats carries `tenant_kv`."""
    return remote_engine_server(
        {
            "num_running": 1,
            "num_waiting": 0,
            "kv_cache_usage": 0.5,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "num_preemptions": 0,
            "tenant_kv": tenant_kv,
        }
    )


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[AdminEnv, str]]:
    """The admin app; tenants acme (quota 30 blocks) and globex; acme's id."""
    e = make_env(tmp_path)
    with e.sessions() as s:
        acme = store.create_tenant(s, name=TENANT).id
        store.create_tenant(s, name=OTHER)
        store.update_tenant(s, name=TENANT, kv_quota_blocks=30)
    yield e, acme
    e.client.close()


@contextlib.contextmanager
def _connected(e: AdminEnv, acme: str) -> Iterator[None]:
    """Wires the app to an in-process engine ("local") and a two-replica set ("remote")
    that report acme's KV use, and shuts the engine servers down after the block."""
    key = f"t:{acme}"
    local = InProcessEngineClient(
        local_engine({key: TenantKVStats(10, 2, 1), "t:someone-else": TenantKVStats(5, 0, 0)})
    )
    figures = {"blocks_in_use": 4, "preemptions_suffered": 0, "preemptions_caused": 3}
    servers = [_engine_server({key: figures}), _engine_server({})]
    connect_engines(e, {"local": local}, [url for _, url in servers])
    try:
        yield
    finally:
        for srv, _ in servers:
            srv.shutdown()


def test_kv_use_per_model_with_pool_share_quota_and_preemptions(
    env: tuple[AdminEnv, str],
) -> None:
    e, acme = env
    with _connected(e, acme):
        r = e.client.get(f"{P}/tenants/{TENANT}/kv", headers=e.token("viewer"))
    assert r.status_code == 200, r.text
    assert r.json() == {
        "tenant": TENANT,
        "kv_quota_blocks": 30,
        "connected": True,
        "models": [
            {
                "model": "local",
                "replicas": 1,
                "num_blocks": 40,
                "block_size": 16,
                "blocks_in_use": 10,
                "share_of_pool": 0.25,
                "preemptions_suffered": 2,
                "preemptions_caused": 1,
            },
            {  # two engine servers: their pools and acme's figures summed
                "model": "remote",
                "replicas": 2,
                "num_blocks": 200,
                "block_size": 8,
                "blocks_in_use": 4,
                "share_of_pool": 0.02,
                "preemptions_suffered": 0,
                "preemptions_caused": 3,
            },
        ],
    }


def test_a_tenant_with_no_kv_reported_reads_zeros(env: tuple[AdminEnv, str]) -> None:
    e, acme = env
    with _connected(e, acme):
        r = e.client.get(f"{P}/tenants/{OTHER}/kv", headers=e.token("operator"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kv_quota_blocks"] is None
    for m in body["models"]:
        assert (m["blocks_in_use"], m["preemptions_suffered"], m["preemptions_caused"]) == (0, 0, 0)
        assert m["share_of_pool"] == 0.0


@pytest.mark.parametrize(
    ("role", "tenant", "path_tenant", "status"),
    [
        ("admin", None, TENANT, 200),
        ("operator", None, TENANT, 200),
        ("viewer", None, TENANT, 200),
        ("tenant-admin", TENANT, TENANT, 200),
        ("tenant-admin", OTHER, TENANT, 404),  # another tenant's: existence not revealed
        ("finance", None, TENANT, 403),
        ("auditor", None, TENANT, 403),
        ("admin", None, "no-such-tenant", 404),
    ],
)
def test_roles_and_unknown_tenant(
    env: tuple[AdminEnv, str], role: str, tenant: str | None, path_tenant: str, status: int
) -> None:
    e, _ = env
    r = e.client.get(f"{P}/tenants/{path_tenant}/kv", headers=e.token(role, tenant))
    assert r.status_code == status, r.text


def test_without_a_gateway_it_is_not_connected(env: tuple[AdminEnv, str]) -> None:
    e, _ = env
    r = e.client.get(f"{P}/tenants/{TENANT}/kv", headers=e.token("admin"))
    assert r.status_code == 200
    assert r.json() == {
        "tenant": TENANT,
        "kv_quota_blocks": 30,
        "connected": False,
        "models": [],
    }
