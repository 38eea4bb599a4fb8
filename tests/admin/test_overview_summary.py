"""The overview's summary tiles and a tenant's spend and budget, from seeded usage rows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from admin import registry
from admin.overview_stats import StatsSampler
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import AdminEnv
from tests.utils.admin_seed import seed_usage

PRICES = registry.Prices(input=1_000_000, cached_input=500_000, output=2_000_000)  # pico per token
P = "/admin/api/v1"


def _now() -> dt.datetime:
    # A few seconds ago, but never before today's UTC midnight (the "today" tiles).
    now = dt.datetime.now(dt.UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return max(now - dt.timedelta(seconds=5), midnight)


def _seed(env: AdminEnv, tenant: str, when: dt.datetime, **fields: Any) -> None:
    """One usage row of model "priced" (tests/utils/admin_seed.py's defaults otherwise)."""
    seed_usage(env, tenant, when, **{"model": "priced", **fields})


@pytest.fixture
def seeded(env: AdminEnv) -> AdminEnv:
    """alpha: 2 served requests and one 500 now; beta: one served and one 429 now, and one
    served request 3 hours ago (outside a 1 h window, inside today unless just past midnight)."""
    with env.sessions() as s:
        register_stand_in(
            s,
            "priced",
            prices=PRICES,
            now=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
        )
    now = _now()
    _seed(env, "alpha", now)
    _seed(env, "alpha", now, prompt_tokens=20, cached_tokens=10, completion_tokens=7)
    _seed(env, "alpha", now, status=500, prompt_tokens=0, cached_tokens=0, completion_tokens=0)
    _seed(env, "beta", now)
    _seed(env, "beta", now, status=429, prompt_tokens=0, cached_tokens=0, completion_tokens=0)
    return env


# Cost of one default row: 6 uncached * 1e6 + 4 cached * 5e5 + 5 out * 2e6 = 18e6 pico-USD.
ROW = 18_000_000
BIG = 10 * 1_000_000 + 10 * 500_000 + 7 * 2_000_000  # the 20/10/7 row: 29e6


def test_summary_counts_the_window_and_spend_of_today_and_month(seeded: AdminEnv) -> None:
    r = seeded.client.get(f"{P}/overview", headers=seeded.token("admin"))
    assert r.status_code == 200
    s = r.json()["summary"]
    assert s["minutes"] == 60
    assert s["requests"] == 5 and s["errors"] == 2
    assert s["error_rate"] == pytest.approx(2 / 5)
    assert s["tokens"] == 15 + 27 + 15
    assert s["prefix_cache_hit_rate"] == pytest.approx((4 + 10 + 4) / (10 + 20 + 10))
    for period in ("today", "month"):
        assert s[period] == {"requests": 5, "tokens": 57, "cost_pico_usd": 2 * ROW + BIG}
    assert s["engine"] == {
        "num_waiting": None,
        "num_running": None,
        "kv_cache_usage": None,
        "sampled_at": None,
    }


def test_summary_of_a_tenant_admin_is_its_tenant_without_the_engines(seeded: AdminEnv) -> None:
    seeded.client.app.state.admin_stats_sampler = StatsSampler(  # type: ignore[attr-defined]
        lambda: {"kv_cache_usage": 0.25, "num_waiting": 3, "num_running": 2}
    )
    admin = seeded.client.get(f"{P}/overview", headers=seeded.token("admin")).json()["summary"]
    assert admin["engine"]["num_waiting"] == 3 and admin["engine"]["num_running"] == 2
    assert admin["engine"]["kv_cache_usage"] == 0.25 and admin["engine"]["sampled_at"]
    ta = seeded.token("tenant-admin", "beta")
    r = seeded.client.get(f"{P}/overview", headers=ta)
    assert r.status_code == 200 and r.json()["engine_stats"] is False
    s = r.json()["summary"]
    assert s["engine"] is None
    assert (s["requests"], s["errors"], s["tokens"]) == (2, 1, 15)
    assert s["today"] == {"requests": 2, "tokens": 15, "cost_pico_usd": ROW}


def test_summary_window_follows_the_range(seeded: AdminEnv) -> None:
    _seed(seeded, "alpha", _now() - dt.timedelta(hours=3))
    headers = seeded.token("viewer")
    hour = seeded.client.get(f"{P}/overview?minutes=60", headers=headers).json()
    day = seeded.client.get(f"{P}/overview?minutes=1440&step_s=900", headers=headers).json()
    assert hour["summary"]["requests"] == 5 and day["summary"]["requests"] == 6
    assert len(day["labels"]) == 96 and day["summary"]["minutes"] == 1440
    week = seeded.client.get(f"{P}/overview?minutes=10080&step_s=60", headers=headers).json()
    assert len(week["labels"]) <= 2000  # the step is widened, not 10,080 points
    assert week["summary"]["requests"] == 6
    too_long = seeded.client.get(f"{P}/overview?minutes=10081", headers=headers)
    assert too_long.status_code == 400


def test_tenant_spend_and_budget_states(seeded: AdminEnv) -> None:
    admin = seeded.token("admin")
    url = f"{P}/tenants/alpha/spend"
    r = seeded.client.get(url, headers=admin)
    assert r.status_code == 200
    body = r.json()
    assert body["today"] == {"requests": 3, "tokens": 42, "cost_pico_usd": ROW + BIG}
    assert body["month"] == body["today"] and body["budget"] is None
    for budget, state in ((100, "ok"), (50, "warning"), (42, "over")):
        put = seeded.client.put(
            f"{P}/tenants/alpha/limits", json={"token_budget": budget}, headers=admin
        )
        assert put.status_code == 200
        got = seeded.client.get(url, headers=admin).json()["budget"]
        assert got["token_budget"] == budget and got["used_tokens"] == 42
        assert got["used_share"] == pytest.approx(42 / budget) and got["state"] == state
        assert got["period"] == "month"
    # A tenant-admin reads its own tenant's spend; another's is 404.
    ta = seeded.token("tenant-admin", "beta")
    assert seeded.client.get(f"{P}/tenants/beta/spend", headers=ta).json()["today"]["tokens"] == 15
    assert seeded.client.get(url, headers=ta).status_code == 404
    assert seeded.client.get(url, headers=seeded.token("auditor")).status_code == 403
