"""Bad admin credentials: one connection per request, throttled per source, audited in aggregate.

Issue 13 §2 and §12: rejected admin calls held a connection and took a second one
for their audit write (a flood exhausted the shared pool); every attempt was a
row; admin-side 500s and CLI changes were never audited.
"""

from __future__ import annotations

import concurrent.futures
import getpass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import select

from admin.app import create_admin_app, make_services
from admin.audit_log import event_dict
from admin.identity import create_admin_token
from admin.models import AuditEvent
from admin.settings import AdminSettings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.admin_env import PEPPER, SIGNING_SEED, AdminEnv, make_env

BAD = {"Authorization": "Bearer clo-adm-" + "x" * 43}  # looks real: costs a database read


def _events(env: AdminEnv) -> list[dict[str, Any]]:
    env.services.audit_writer.flush()
    with env.sessions() as s:
        return [event_dict(e) for e in s.scalars(select(AuditEvent).order_by(AuditEvent.seq))]


def test_rejections_hold_at_most_one_connection(tmp_path: Path) -> None:
    # A pool of ONE connection that times out at once: a rejected call that takes a
    # second connection for its audit write fails with a 500 instead of a 401.
    url = f"sqlite:///{tmp_path / 'admin.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=1))
    settings = AdminSettings(audit_signing_key=SIGNING_SEED, auth_failure_limit=0)  # type: ignore[arg-type]
    services = make_services(sessions, pepper=PEPPER, settings=settings)
    client = TestClient(create_admin_app(services), raise_server_exceptions=False)
    statuses = [client.get("/admin/api/v1/tenants", headers=BAD).status_code for _ in range(5)]
    assert statuses == [401] * 5
    # An admin's write, its audit record and a verify of the log fit in the one connection too.
    with sessions() as s:
        token = create_admin_token(s, pepper=PEPPER, role="admin").secret
    admin = {"Authorization": f"Bearer {token}"}
    assert (
        client.post("/admin/api/v1/tenants", json={"name": "a"}, headers=admin).status_code == 201
    )
    verify = client.get("/admin/api/v1/audit/verify", headers=admin)
    assert verify.status_code == 200 and verify.json()["ok"] is True
    assert verify.json()["records"] >= 1


def test_bad_credentials_are_throttled_per_source_and_audited_in_aggregate(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path, auth_failure_limit=10, auth_failure_window_s=60)
    client = env.client

    def call(_: int) -> int:
        return client.get("/admin/api/v1/tenants", headers=BAD).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(call, range(40)))
    assert set(statuses) <= {401, 429}
    assert statuses.count(401) >= 10 and statuses.count(429) >= 1
    refused = client.get("/admin/api/v1/tenants", headers=BAD)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    # Even a valid token is refused from a throttled source (a brute force gets no oracle).
    assert client.get("/admin/api/v1/tenants", headers=env.token("admin")).status_code == 429
    denials = [e for e in _events(env) if e["outcome"].startswith("denied")]
    assert 1 <= len(denials) <= 3  # one per source and outcome, not one per attempt
    assert sum(e["detail"]["count"] for e in denials) == 42
    assert {e["source_ip"] for e in denials} == {"testclient"}
    assert all(e["action"] == "auth.denied" for e in denials)


def test_forbidden_calls_are_aggregated_too(env: AdminEnv) -> None:
    viewer = env.token("viewer")
    for _ in range(5):
        r = env.client.post("/admin/api/v1/tokens", json={"role": "viewer"}, headers=viewer)
        assert r.status_code == 403
    denials = [e for e in _events(env) if e["outcome"] == "denied:403"]
    assert len(denials) == 1 and denials[0]["detail"]["count"] == 5
    assert denials[0]["actor"].startswith("token:") and denials[0]["action"] == "access.denied"


def test_admin_side_500_is_audited(env: AdminEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(store, "create_tenant", broken)
    client = TestClient(env.client.app, raise_server_exceptions=False)
    r = client.post("/admin/api/v1/tenants", json={"name": "x"}, headers=env.token("admin"))
    assert r.status_code == 500
    errors = [e for e in _events(env) if e["outcome"] == "error:500"]
    assert len(errors) == 1
    assert errors[0]["action"] == "POST /admin/api/v1/tenants"
    assert errors[0]["actor"].startswith("token:") and errors[0]["detail"] == {
        "error": "RuntimeError"
    }


def test_cli_changes_are_audited_with_the_os_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloister.cli import main

    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_ADMIN_AUDIT_SIGNING_KEY", SIGNING_SEED)
    monkeypatch.setenv("CLOISTER_ADMIN_AUDIT_CHECKPOINT_EVERY", "3")
    runner = CliRunner()

    def run(*args: str) -> str:
        out = runner.invoke(main, list(args))
        assert out.exit_code == 0, out.output
        return out.output

    run("tenants", "create", "acme")
    key_id = run("keys", "create", "--tenant", "acme", "--json").split('"id": "')[1].split('"')[0]
    run("tenants", "set-limits", "acme", "--rpm", "10", "--models", "tiny")
    run("tenants", "suspend", "acme")
    run("tenants", "resume", "acme")
    run("keys", "revoke", key_id)
    token = run("admin", "create-token", "--role", "viewer", "--json")
    assert "clo-adm-" in token
    url = f"sqlite:///{(tmp_path / 'cloister.db').resolve()}"
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        token_id = s.scalars(select(AuditEvent.detail).order_by(AuditEvent.seq.desc())).first()
    assert token_id is not None
    run("admin", "revoke-token", token_id["id"])
    with sessions() as s:
        events = [event_dict(e) for e in s.scalars(select(AuditEvent).order_by(AuditEvent.seq))]
    assert [e["action"] for e in events] == [
        "tenant.create",
        "key.create",
        "limits.set",
        "tenant.update",
        "tenant.update",
        "key.revoke",
        "token.create",
        "token.revoke",
    ]
    assert {e["actor"] for e in events} == {f"cli:{getpass.getuser()}"}
    assert events[2]["detail"] == {"rpm": 10, "allowed_models": ["tiny"]}
    assert [e["detail"]["status"] for e in events[3:5]] == ["suspended", "active"]
    assert all(e["tenant_id"] for e in events[:6])
    verify = run("audit", "verify")
    assert "ok: 8 records" in verify
    with sessions() as s:
        assert store.get_tenant(s, "acme").status == "active"
