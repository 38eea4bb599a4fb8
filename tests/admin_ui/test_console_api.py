"""The console's API routes and static serving, on the admin app (no browser, no engine)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from admin.overview_stats import Sample, StatsSampler, overview, p95
from tenancy import store
from tests.utils.admin_env import AdminEnv, make_env
from tests.utils.admin_seed import env_with_tenants, seed_usage


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AdminEnv]:
    """The admin app (the console is part of it), tenants alpha and beta."""
    yield from env_with_tenants(tmp_path, "alpha", "beta")


def test_p95_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([3.0]) == 3.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0


def test_overview_buckets_usage_and_engine_samples(env: AdminEnv) -> None:
    now = dt.datetime(2026, 5, 1, 12, 0, 30, tzinfo=dt.UTC)
    seed_usage(env, "alpha", now - dt.timedelta(seconds=20))
    seed_usage(env, "alpha", now - dt.timedelta(seconds=10), ttft_s=0.3, latency_s=1.1)
    seed_usage(env, "beta", now - dt.timedelta(seconds=5), status=429, prompt_tokens=0)
    seed_usage(env, "beta", now - dt.timedelta(minutes=90))  # outside the hour
    t0 = now.timestamp()
    samples = [
        Sample(
            t0 - 50, {"kv_cache_usage": 0.2, "prefix_cache_queries": 100, "prefix_cache_hits": 10}
        ),
        Sample(
            t0 - 5, {"kv_cache_usage": 0.4, "prefix_cache_queries": 200, "prefix_cache_hits": 60}
        ),
    ]
    with env.sessions() as s:
        out = overview(s, now=now, minutes=60, step_s=60, samples=samples)
    series = out["series"]
    assert isinstance(series, dict)
    assert len(series["requests_per_s"]) == 60
    last = -1  # the minute holding `now`
    assert series["requests_per_s"][last] == pytest.approx(2 / 60)
    assert series["tokens_per_s"][last] == pytest.approx(30 / 60)
    assert series["rate_limit_rejections"][last] == 1
    assert series["ttft_p95_s"][last] == pytest.approx(0.3)
    assert series["itl_p95_s"][last] == pytest.approx((1.1 - 0.3) / 4)
    # The first sample (11:59:40) falls in the minute before; a counter delta counts in the
    # minute of the later sample.
    assert series["kv_cache_usage"][last] == pytest.approx(0.4)
    assert series["kv_cache_usage"][last - 1] == pytest.approx(0.2)
    assert series["prefix_cache_hit_rate"][last] == pytest.approx(50 / 100)
    assert sum(series["requests_per_s"][:last]) == 0
    with env.sessions() as s:
        alpha = store.get_tenant(s, "beta").id
        scoped = overview(s, now=now, minutes=60, step_s=60, samples=None, tenant_id=alpha)
    assert scoped["series"]["requests_per_s"][last] == 0  # type: ignore[index]


def test_sampler_keeps_a_window_and_rate_limits_itself() -> None:
    clock = [1000.0]
    calls = []

    def source() -> dict[str, float]:
        calls.append(clock[0])
        return {"kv_cache_usage": 0.5}

    sampler = StatsSampler(source, window_s=60, min_interval_s=2, clock=lambda: clock[0])
    sampler.sample()
    sampler.sample()  # too soon: skipped
    clock[0] += 100
    sampler.sample()
    assert calls == [1000.0, 1100.0]
    assert [s.at for s in sampler.samples()] == [1100.0]


def test_overview_route_roles(env: AdminEnv) -> None:
    assert env.client.get("/admin/api/v1/overview").status_code == 401
    for role, tenant in (("admin", None), ("viewer", None), ("tenant-admin", "alpha")):
        r = env.client.get("/admin/api/v1/overview", headers=env.token(role, tenant))
        assert r.status_code == 200, role
        assert r.json()["engine_stats"] is False


def test_tenant_settings_admin_only_and_validated(env: AdminEnv) -> None:
    admin = env.token("admin")
    url = "/admin/api/v1/tenants/alpha/settings"
    r = env.client.patch(url, json={"isolation_level": "key", "weight": 3}, headers=admin)
    assert r.status_code == 200 and r.json()["isolation_level"] == "key" and r.json()["weight"] == 3
    assert env.client.patch(url, json={"weight": 0}, headers=admin).status_code == 400
    assert env.client.patch(url, json={"isolation_level": "x"}, headers=admin).status_code == 400
    assert env.client.patch(url, json={"weight": 2}, headers=env.token("viewer")).status_code == 403
    ta = env.token("tenant-admin", "alpha")
    assert env.client.patch(url, json={"weight": 2}, headers=ta).status_code == 403
    assert env.client.get("/admin/api/v1/tenants/alpha", headers=admin).json()["weight"] == 3


def test_tenant_settings_carry_the_cache_policy(env: AdminEnv) -> None:
    admin = env.token("admin")
    url = "/admin/api/v1/tenants/alpha/settings"
    body = {
        "isolation_level": "user",
        "weight": 2,
        "cache_floor_blocks": None,
        "cache_floor_share": 0.5,
        "retention_ttl_s": 12.5,
        "scrub_on_free": False,
        "never_cache": True,
    }
    r = env.client.patch(url, json=body, headers=admin)
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in body} == {**body, "weight": 2.0}
    for bad in (
        {"cache_floor_share": 2},
        {"cache_floor_blocks": 3, "cache_floor_share": 0.1},
        {"retention_ttl_s": -1},
        {"never_cache": "yes"},
        {"isolation_level": "key", "retention_ttl_s": 0},  # nothing changes, isolation neither
    ):
        r = env.client.patch(url, json=bad, headers=admin)
        assert r.status_code == 400, (bad, r.text)
    t = env.client.get("/admin/api/v1/tenants/alpha", headers=admin).json()
    assert {k: t[k] for k in body} == {**body, "weight": 2.0}


def test_audit_search_filters(env: AdminEnv) -> None:
    admin = env.token("admin")
    env.client.patch("/admin/api/v1/tenants/alpha/settings", json={"weight": 2}, headers=admin)
    env.client.get("/admin/api/v1/tenants/beta", headers=env.token("tenant-admin", "alpha"))
    url = "/admin/api/v1/audit/search"
    items = env.client.get(url, params={"action": "tenant.settings"}, headers=admin).json()["items"]
    assert [i["resource"] for i in items] == ["tenants/alpha"]
    denied = env.client.get(url, params={"outcome": "denied"}, headers=admin).json()["items"]
    assert denied and all(i["outcome"].startswith("denied") for i in denied)
    future = env.client.get(url, params={"since": "2999-01-01T00:00:00Z"}, headers=admin)
    assert future.json()["total"] == 0
    actor = items[0]["actor"]
    by_actor = env.client.get(url, params={"actor": actor}, headers=admin).json()["items"]
    assert by_actor and {i["actor"] for i in by_actor} == {actor}
    assert env.client.get(url, headers=env.token("tenant-admin", "alpha")).status_code == 403
    assert (
        env.client.get(url, params={"since": "2026-01-01T00:00:00"}, headers=admin).status_code
        == 400
    )


def test_console_page_and_assets_are_served_locally(env: AdminEnv) -> None:
    page = env.client.get("/admin")
    assert page.status_code == 200 and "<title>Cloister admin</title>" in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "http" not in page.text.replace("http-equiv", "")  # no CDN, no absolute URL
    assert env.client.get("/admin/static/js/app.js").status_code == 200
    chart = env.client.get("/admin/vendor/chart.umd.min.js")
    assert chart.status_code == 200 and "Chart" in chart.text[:5000]
    assert env.client.get("/admin/api/v1/console/config").json() == {"oidc": False}


def test_console_config_reports_oidc(tmp_path: Path) -> None:
    e = make_env(
        tmp_path,
        oidc_issuer="https://issuer.example",
        oidc_client_id="cloister",
    )
    with TestClient(e.client.app) as client:
        assert client.get("/admin/api/v1/console/config").json() == {"oidc": True}
