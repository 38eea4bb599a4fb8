"""A tenant's stream_cadence through the admin API: set on create, PATCH and the
console's settings route, shown by GET and the list, audited; every bad value is a 400
in OpenAI's error format naming the field, with nothing changed."""

from __future__ import annotations

from typing import Any

import pytest

from admin.models import AuditEvent
from tests.utils.admin_env import AdminEnv

P = "/admin/api/v1"


def _cadence(env: AdminEnv, name: str = "alpha") -> str:
    r = env.client.get(f"{P}/tenants/{name}", headers=env.token("admin"))
    assert r.status_code == 200, r.text
    return str(r.json()["stream_cadence"])


def _audit(env: AdminEnv, action: str) -> list[AuditEvent]:
    env.services.audit_writer.flush()
    with env.sessions() as s:
        return list(s.query(AuditEvent).filter(AuditEvent.action == action).all())


def test_default_is_token_and_patch_sets_shows_and_audits(env: AdminEnv) -> None:
    admin = env.token("admin")
    assert _cadence(env) == "token"
    r = env.client.patch(f"{P}/tenants/alpha", json={"stream_cadence": "fixed:4"}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["stream_cadence"] == "fixed:4"
    assert (_cadence(env), _cadence(env, "beta")) == ("fixed:4", "token")
    listed = env.client.get(f"{P}/tenants", headers=env.token("viewer")).json()["items"]
    assert {t["name"]: t["stream_cadence"] for t in listed} == {"alpha": "fixed:4", "beta": "token"}
    (event,) = _audit(env, "tenant.update")
    assert event.outcome == "success" and event.detail is not None
    assert event.detail["stream_cadence"] == "fixed:4"
    # Other policy changes keep it; the settings route (the console's) sets it too.
    r = env.client.patch(f"{P}/tenants/alpha", json={"weight": 2}, headers=admin)
    assert r.json()["stream_cadence"] == "fixed:4"
    r = env.client.patch(
        f"{P}/tenants/alpha/settings", json={"stream_cadence": "token"}, headers=admin
    )
    assert r.status_code == 200 and r.json()["stream_cadence"] == "token", r.text
    assert _cadence(env) == "token"


def test_create_takes_a_cadence(env: AdminEnv) -> None:
    admin = env.token("admin")
    r = env.client.post(
        f"{P}/tenants", json={"name": "gamma", "stream_cadence": "fixed:64"}, headers=admin
    )
    assert r.status_code == 201, r.text
    assert r.json()["stream_cadence"] == "fixed:64" and _cadence(env, "gamma") == "fixed:64"
    r = env.client.post(f"{P}/tenants", json={"name": "delta"}, headers=admin)
    assert r.status_code == 201 and r.json()["stream_cadence"] == "token", r.text
    (event, _) = _audit(env, "tenant.create")
    assert event.detail is not None and event.detail["after"]["stream_cadence"] == "fixed:64"


BAD = ["fixed:0", "fixed:-1", "fixed:100000", "fixed:65", "fixed:abc", "fixed:", "chunky", "",
       "fixed:4\n", 4, 4.0, True, None, ["fixed:4"], {"n": 4}]  # fmt: skip


@pytest.mark.parametrize("value", BAD)
def test_bad_cadence_is_a_400_naming_the_field(env: AdminEnv, value: Any) -> None:
    admin = env.token("admin")
    env.client.patch(f"{P}/tenants/alpha", json={"stream_cadence": "fixed:2"}, headers=admin)
    for path in (f"{P}/tenants/alpha", f"{P}/tenants/alpha/settings"):
        r = env.client.patch(path, json={"stream_cadence": value, "weight": 3}, headers=admin)
        assert r.status_code == 400, (path, value, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error", r.text
        assert "stream_cadence" in error["message"], r.text
        assert error["param"] in (None, "stream_cadence"), r.text
    t = env.client.get(f"{P}/tenants/alpha", headers=admin).json()
    assert (t["stream_cadence"], t["weight"]) == ("fixed:2", 1.0)  # nothing changed
    r = env.client.post(
        f"{P}/tenants", json={"name": "gamma", "stream_cadence": value}, headers=admin
    )
    assert r.status_code == 400, r.text
    assert "stream_cadence" in r.json()["error"]["message"], r.text
    assert env.client.get(f"{P}/tenants/gamma", headers=admin).status_code == 404


def test_a_string_bad_value_names_the_param(env: AdminEnv) -> None:
    r = env.client.patch(
        f"{P}/tenants/alpha", json={"stream_cadence": "fixed:0"}, headers=env.token("admin")
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_cadence", r.text


def test_only_platform_writers_set_it(env: AdminEnv) -> None:
    for headers in (env.token("viewer"), env.token("tenant-admin", "alpha")):
        r = env.client.patch(
            f"{P}/tenants/alpha", json={"stream_cadence": "fixed:4"}, headers=headers
        )
        assert r.status_code == 403, r.text
    assert _cadence(env) == "token"
