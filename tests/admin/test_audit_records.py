"""What an audit record says: who (id and name), which request, what changed; no secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from admin import registry
from admin.audit_log import AuditLog, event_dict
from admin.identity import create_admin_token
from admin.models import AuditEvent
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_db import migrated_postgres
from tests.utils.admin_env import PEPPER, AdminEnv

P = "/admin/api/v1"


def _named(env: AdminEnv, name: str, role: str = "admin") -> tuple[dict[str, str], str]:
    with env.sessions() as s:
        created = create_admin_token(s, pepper=PEPPER, role=role, name=name)
    return {"Authorization": f"Bearer {created.secret}"}, created.id


def _events(env: AdminEnv, action: str | None = None) -> list[dict[str, Any]]:
    env.services.audit_writer.flush()
    with env.sessions() as s:
        rows = s.scalars(select(AuditEvent).order_by(AuditEvent.seq)).all()
        return [event_dict(r) for r in rows if action is None or r.action == action]


def test_updates_record_before_after_actor_name_and_request_id(env: AdminEnv) -> None:
    headers, token_id = _named(env, "ops-alice", "operator")
    for rpm, rid in ((5, "req-1"), (10, "req-2")):
        r = env.client.put(
            f"{P}/tenants/alpha/limits",
            json={"rpm": rpm, "token_budget": 1000},
            headers={**headers, "x-request-id": rid},
        )
        assert r.status_code == 200, r.text
    first, second = _events(env, "limits.set")
    assert first["detail"]["after"] == {"rpm": 5, "token_budget": 1000}
    assert second["detail"] == {"before": {"rpm": 5}, "after": {"rpm": 10}}
    assert second["actor"] == f"token:{token_id}" and second["actor_name"] == "ops-alice"
    assert (second["role"], second["request_id"]) == ("operator", "req-2")

    r = env.client.patch(f"{P}/tenants/alpha", json={"weight": 2.5}, headers=headers)
    assert r.status_code == 200, r.text
    (update,) = _events(env, "tenant.update")
    assert update["detail"] == {"weight": 2.5, "before": {"weight": 1.0}, "after": {"weight": 2.5}}

    with env.sessions() as s:
        register_stand_in(
            s,
            "m",
            prices=registry.Prices(1, 1, 2),
        )
    body = {"input_price": 3, "cached_input_price": 1, "output_price": 6}
    assert env.client.post(f"{P}/models/m/prices", json=body, headers=headers).status_code == 201
    (price,) = _events(env, "model.price")
    assert price["detail"]["before"]["price"]["input_price"] == 1
    assert price["detail"]["after"]["price"]["input_price"] == 3
    assert price["detail"]["after"]["price"]["output_price"] == 6

    r = env.client.patch(f"{P}/models/m", json={"status": "loaded"}, headers=headers)
    assert r.status_code == 200, r.text
    (model,) = _events(env, "model.update")
    assert model["detail"] == {"before": {"status": "registered"}, "after": {"status": "loaded"}}


def test_no_secret_reaches_any_record(env: AdminEnv) -> None:
    headers, _ = _named(env, "root")
    key = env.client.post(f"{P}/tenants/alpha/keys", json={"name": "k"}, headers=headers).json()
    token = env.client.post(
        f"{P}/tokens", json={"role": "finance", "name": "fin"}, headers=headers
    ).json()
    revoked = env.client.post(f"{P}/tokens/{token['id']}/revoke", headers=headers)
    assert revoked.status_code == 200
    everything = json.dumps(_events(env))
    assert key["secret"] not in everything and token["token"] not in everything
    bearer = headers["Authorization"].removeprefix("Bearer ")
    assert bearer not in everything
    (created,) = _events(env, "key.create")
    assert created["detail"] == {"id": key["id"], "prefix": key["prefix"], "name": "k"}
    (minted,) = _events(env, "token.create")
    assert minted["detail"]["id"] == token["id"] and minted["detail"]["role"] == "finance"
    (revoke,) = _events(env, "token.revoke")
    assert revoke["detail"]["id"] == token["id"] and revoke["actor_name"] == "root"


def test_a_records_name_is_under_the_chain(env: AdminEnv) -> None:
    headers, _ = _named(env, "ops-bob")
    assert (
        env.client.post(f"{P}/tenants", json={"name": "gamma"}, headers=headers).status_code == 201
    )
    verify = env.client.get(f"{P}/audit/verify", headers=headers).json()
    assert verify["ok"] is True, verify
    found = env.client.get(f"{P}/audit/search?actor=ops-bob", headers=headers).json()
    assert [e["action"] for e in found["items"]] == ["tenant.create"]
    with env.sessions() as s:
        row = s.scalars(select(AuditEvent).where(AuditEvent.action == "tenant.create")).one()
        row.actor_name = "someone-else"  # rewriting who acted breaks the chain
        s.commit()
    verify = env.client.get(f"{P}/audit/verify", headers=headers).json()
    assert verify["ok"] is False and verify["first_bad_seq"] is not None


def test_every_request_has_an_id_in_its_response_and_its_records(env: AdminEnv) -> None:
    headers, _ = _named(env, "ops")
    r = env.client.post(f"{P}/tenants", json={"name": "delta"}, headers=headers)
    made = r.headers["x-request-id"]
    assert made and "," not in made  # one id, sent once
    long = env.client.post(
        f"{P}/tenants", json={"name": "epsilon"}, headers={**headers, "x-request-id": "r" * 5000}
    )
    # An unusable client id (over 128 characters) is ignored: the server's own is used.
    server_id = long.headers["x-request-id"]
    assert server_id != "r" * 5000 and len(server_id) <= 128
    export = env.client.get(f"{P}/audit/export", headers={**headers, "x-request-id": "exp-1"})
    assert export.headers["x-request-id"] == "exp-1"
    ids = [e["request_id"] for e in _events(env, "tenant.create")]
    assert ids == [made, server_id]
    assert [e["request_id"] for e in _events(env, "audit.export")] == ["exp-1"]


def test_over_long_request_ids_and_names_fit_postgresql(tmp_path: Path) -> None:
    """A caller's 5,000-character x-request-id must not make the insert fail (and the
    writer retry it forever): the record keeps the id's first 128 characters."""
    with migrated_postgres() as (_, sessions):
        log = AuditLog(sessions, signing_key=None)
        sealed = log.record(
            actor="token:adm_1",
            actor_name="n" * 5000,
            role="admin",
            action="tenant.create",
            resource="tenants/x",
            outcome="success",
            request_id="r" * 5000,
        )
        (records, _) = log.load()
    assert sealed["request_id"] == "r" * 128 and records[0]["actor_name"] == "n" * 256


def test_a_create_records_what_was_made(env: AdminEnv) -> None:
    headers, _ = _named(env, "ops")
    made = env.client.post(f"{P}/tenants", json={"name": "zeta", "weight": 3}, headers=headers)
    assert made.status_code == 201
    (create,) = _events(env, "tenant.create")
    assert create["detail"]["after"] == made.json()
