"""Tenant weight, cache policy and KV quota through PATCH /tenants/{name}, and prefix
withdrawal.

Every field is stored, returned and audited; every bad value is a 400 in OpenAI's
error format with nothing changed (a KV quota over the pool of the engines served
too); DELETE /prefixes/{name} is audited and 404s for an unknown name.
"""

from __future__ import annotations

from typing import Any

import pytest

from admin.models import AuditEvent
from engine_hop.in_process import InProcessEngineClient
from tests.admin.engine_stand_ins import FixedStatsEngine, connect_engines, idle_stats
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import AdminEnv
from tests.utils.cache_policy_defaults import DEFAULT_CACHE_POLICY

P = "/admin/api/v1"
DEFAULTS = DEFAULT_CACHE_POLICY


def _policy(env: AdminEnv, name: str = "alpha") -> dict[str, Any]:
    t = env.client.get(f"{P}/tenants/{name}", headers=env.token("admin")).json()
    return {k: t[k] for k in DEFAULTS}


def _audit(env: AdminEnv, action: str) -> list[AuditEvent]:
    env.services.audit_writer.flush()
    with env.sessions() as s:
        return list(s.query(AuditEvent).filter(AuditEvent.action == action).all())


def test_every_field_is_set_returned_and_audited(env: AdminEnv) -> None:
    assert _policy(env) == DEFAULTS
    body = {
        "weight": 2.5,
        "cache_floor_blocks": 16,
        "retention_ttl_s": 60,
        "scrub_on_free": True,
        "never_cache": True,
    }
    r = env.client.patch(f"{P}/tenants/alpha", json=body, headers=env.token("admin"))
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in DEFAULTS} == {**DEFAULTS, **body, "retention_ttl_s": 60.0}
    assert _policy(env) == {**DEFAULTS, **body}
    assert _policy(env, "beta") == DEFAULTS  # only the named tenant changed
    (event,) = _audit(env, "tenant.update")
    assert event.outcome == "success" and event.resource == "tenants/alpha"
    assert event.detail is not None and event.detail["cache_floor_blocks"] == 16


def test_floor_is_blocks_or_share_and_null_restores_defaults(env: AdminEnv) -> None:
    admin = env.token("admin")
    env.client.patch(f"{P}/tenants/alpha", json={"cache_floor_blocks": 8}, headers=admin)
    r = env.client.patch(f"{P}/tenants/alpha", json={"cache_floor_share": 0.3}, headers=admin)
    assert r.status_code == 200, r.text
    assert (r.json()["cache_floor_blocks"], r.json()["cache_floor_share"]) == (None, 0.3)
    env.client.patch(
        f"{P}/tenants/alpha", json={"retention_ttl_s": 5, "scrub_on_free": False}, headers=admin
    )
    r = env.client.patch(
        f"{P}/tenants/alpha",
        json={"cache_floor_share": None, "retention_ttl_s": None, "scrub_on_free": None},
        headers=admin,
    )
    assert r.status_code == 200, r.text
    assert _policy(env) == DEFAULTS
    # status alone still suspends, and leaves the policy as it is
    env.client.patch(f"{P}/tenants/alpha", json={"weight": 3}, headers=admin)
    r = env.client.patch(f"{P}/tenants/alpha", json={"status": "suspended"}, headers=admin)
    assert r.json()["status"] == "suspended" and r.json()["weight"] == 3.0


BAD_BODIES = [
    '{"weight": 0}',
    '{"weight": 101}',
    '{"weight": Infinity}',
    '{"weight": NaN}',
    '{"weight": null}',
    '{"weight": "2"}',
    '{"cache_floor_blocks": -1}',
    f'{{"cache_floor_blocks": {2**31}}}',
    '{"cache_floor_blocks": 1.5}',
    '{"cache_floor_blocks": "8"}',
    '{"cache_floor_blocks": true}',
    '{"cache_floor_share": -0.1}',
    '{"cache_floor_share": 1.5}',
    '{"cache_floor_share": NaN}',
    '{"cache_floor_share": "half"}',
    '{"cache_floor_blocks": 4, "cache_floor_share": 0.5}',
    '{"retention_ttl_s": 0}',
    '{"retention_ttl_s": -5}',
    '{"retention_ttl_s": 1e12}',
    '{"retention_ttl_s": Infinity}',
    '{"scrub_on_free": "yes"}',
    '{"scrub_on_free": 1}',
    '{"never_cache": null}',
    '{"never_cache": "true"}',
    '{"never_cache": 0}',
    '{"kv_quota_blocks": 0}',
    '{"kv_quota_blocks": -1}',
    '{"kv_quota_blocks": 1.5}',
    '{"kv_quota_blocks": "8"}',
    '{"kv_quota_blocks": true}',
    f'{{"kv_quota_blocks": {2**31}}}',
    f'{{"kv_quota_blocks": {2**40}}}',
    '{"kv_quota_blocks": 4, "weight": 0}',  # a bad weight keeps the quota out too
    '{"cache_floor": 4}',  # unknown field
    '{"status": "gone", "weight": 2}',  # a bad status changes nothing else either
    '{"status": "suspended", "weight": 0}',  # nor a bad weight the status
    "[]",
]


@pytest.mark.parametrize("raw", BAD_BODIES)
def test_bad_values_are_400_and_change_nothing(env: AdminEnv, raw: str) -> None:
    r = env.client.patch(
        f"{P}/tenants/alpha",
        content=raw,
        headers={**env.token("admin"), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, (raw, r.status_code, r.text)
    error = r.json()["error"]  # OpenAI's error format, as everywhere
    assert error["type"] == "invalid_request_error" and error["message"], r.text
    assert _policy(env) == DEFAULTS
    t = env.client.get(f"{P}/tenants/alpha", headers=env.token("admin")).json()
    assert t["status"] == "active"


def test_kv_quota_is_set_shown_audited_and_cleared(env: AdminEnv) -> None:
    admin = env.token("admin")
    r = env.client.patch(f"{P}/tenants/alpha", json={"kv_quota_blocks": 24}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["kv_quota_blocks"] == 24
    assert _policy(env) == {**DEFAULTS, "kv_quota_blocks": 24}
    assert _policy(env, "beta") == DEFAULTS
    listed = env.client.get(f"{P}/tenants", headers=env.token("viewer")).json()["items"]
    assert {t["name"]: t["kv_quota_blocks"] for t in listed} == {"alpha": 24, "beta": None}
    (event,) = _audit(env, "tenant.update")
    assert event.detail is not None and event.detail["kv_quota_blocks"] == 24
    # Other policy changes keep it; null clears it (no quota).
    r = env.client.patch(f"{P}/tenants/alpha", json={"weight": 2}, headers=admin)
    assert r.json()["kv_quota_blocks"] == 24
    r = env.client.patch(f"{P}/tenants/alpha", json={"kv_quota_blocks": None}, headers=admin)
    assert r.status_code == 200 and r.json()["kv_quota_blocks"] is None, r.text
    # The console's settings route carries it too; an operator may set it.
    r = env.client.patch(
        f"{P}/tenants/alpha/settings", json={"kv_quota_blocks": 1}, headers=env.token("operator")
    )
    assert r.status_code == 200 and r.json()["kv_quota_blocks"] == 1, r.text


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8", 2**31, 2**40])
def test_bad_kv_quota_is_a_400_naming_the_field(env: AdminEnv, value: Any) -> None:
    admin = env.token("admin")
    env.client.patch(f"{P}/tenants/alpha", json={"kv_quota_blocks": 5}, headers=admin)
    for path in (f"{P}/tenants/alpha", f"{P}/tenants/alpha/settings"):
        r = env.client.patch(path, json={"kv_quota_blocks": value}, headers=admin)
        assert r.status_code == 400, (path, value, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error", r.text
        assert "kv_quota_blocks" in error["message"], r.text
        assert error["param"] in (None, "kv_quota_blocks"), r.text
    assert _policy(env)["kv_quota_blocks"] == 5


def test_kv_quota_over_the_served_pool_is_refused(env: AdminEnv) -> None:
    """With an engine in this process the pool bounds the quota; the admin service alone
    (no engine: the test before) checks only the range."""
    admin = env.token("admin")
    engines = {"local": InProcessEngineClient(FixedStatsEngine(idle_stats()))}
    connect_engines(env, engines)
    for path in (f"{P}/tenants/alpha", f"{P}/tenants/alpha/settings"):
        r = env.client.patch(path, json={"kv_quota_blocks": 41}, headers=admin)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error", r.text
        assert "kv_quota_blocks" in error["message"] and "40 blocks" in error["message"], r.text
    assert _policy(env) == DEFAULTS
    assert [e.outcome for e in _audit(env, "tenant.update")] == ["error"]
    r = env.client.patch(f"{P}/tenants/alpha", json={"kv_quota_blocks": 40}, headers=admin)
    assert r.status_code == 200 and r.json()["kv_quota_blocks"] == 40, r.text
    # Without a quota in the body the pool is not consulted.
    r = env.client.patch(f"{P}/tenants/alpha", json={"weight": 2}, headers=admin)
    assert r.status_code == 200, r.text


def test_viewer_cannot_set_kv_quota(env: AdminEnv) -> None:
    roles = ("viewer", "finance", "auditor")
    for headers in (*map(env.token, roles), env.token("tenant-admin", "alpha")):
        for path in (f"{P}/tenants/alpha", f"{P}/tenants/alpha/settings"):
            r = env.client.patch(path, json={"kv_quota_blocks": 4}, headers=headers)
            assert r.status_code == 403, r.text
            assert r.json()["error"]["message"], r.text
    assert _policy(env) == DEFAULTS


def test_only_admins_change_policy(env: AdminEnv) -> None:
    for headers in (env.token("viewer"), env.token("tenant-admin", "alpha")):
        r = env.client.patch(f"{P}/tenants/alpha", json={"never_cache": True}, headers=headers)
        assert r.status_code == 403, r.text
    assert _policy(env) == DEFAULTS
    r = env.client.patch(f"{P}/tenants/nobody", json={"weight": 2}, headers=env.token("admin"))
    assert r.status_code == 404


def test_withdraw_prefix_is_audited_and_unknown_is_404(env: AdminEnv) -> None:
    admin = env.token("admin")
    with env.sessions() as s:
        register_stand_in(s, "base")
    r = env.client.post(
        f"{P}/prefixes", json={"name": "sys", "model": "base", "text": "You are"}, headers=admin
    )
    assert r.status_code == 201, r.text
    r = env.client.delete(f"{P}/prefixes/sys", headers=env.token("viewer"))
    assert r.status_code == 403
    r = env.client.delete(f"{P}/prefixes/sys", headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "sys" and r.json()["text"] == "You are"
    assert env.client.get(f"{P}/prefixes", headers=admin).json()["items"] == []
    (event,) = _audit(env, "prefix.withdraw")
    assert event.outcome == "success" and event.resource == "prefixes/sys"
    for name in ("sys", "x" * 300):
        r = env.client.delete(f"{P}/prefixes/{name}", headers=admin)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["message"]
    # A NUL is refused before any lookup (PostgreSQL cannot compare one): nothing to audit.
    r = env.client.delete(f"{P}/prefixes/%00", headers=admin)
    assert r.status_code == 400 and "NUL" in r.json()["error"]["message"], r.text
    assert [e.outcome for e in _audit(env, "prefix.withdraw")][1:] == ["error"] * 2
    # published again under the same name once withdrawn
    r = env.client.post(
        f"{P}/prefixes", json={"name": "sys", "model": "base", "token_ids": [3]}, headers=admin
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"name": "p", "model": "base", "text": ""},
        {"name": "p", "model": "base", "token_ids": []},
        {"name": "p", "model": "base", "token_ids": [-1]},
        {"name": "p", "model": "base", "text": "a", "token_ids": [1]},
        {"name": "p", "model": "base"},
    ],
)
def test_bad_prefix_is_400(env: AdminEnv, body: dict[str, Any]) -> None:
    with env.sessions() as s:
        register_stand_in(s, "base")
    r = env.client.post(f"{P}/prefixes", json=body, headers=env.token("admin"))
    assert r.status_code == 400, r.text
    assert env.client.get(f"{P}/prefixes", headers=env.token("admin")).json()["total"] == 0
