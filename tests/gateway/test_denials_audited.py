"""Gateway authorization denials reach the audit log, aggregated per source (issue 13 §12).

Runs the real `cloister serve` wiring (`build_app`) in-process on the fast fake engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from assembly.app import build_app
from tenancy import store
from tests.utils.built_app import (
    admin_secret,
    close_app,
    fake_settings,
    migrated_sessions,
    tenant_keys,
)
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER


def test_bad_keys_suspended_tenants_and_disallowed_models_are_audited_in_aggregate(
    tmp_path: Path,
) -> None:
    settings = fake_settings(tmp_path)
    sessions = migrated_sessions(settings)
    with sessions() as s:
        store.create_tenant(s, name="acme")
        store.set_limits(s, tenant_name="acme", allowed_models=["other"])
        narrow = store.create_key(s, tenant_name="acme", pepper=PEPPER)
        store.create_tenant(s, name="gone")
        suspended = store.create_key(s, tenant_name="gone", pepper=PEPPER).secret
        store.set_tenant_status(s, name="gone", status="suspended")
    admin = admin_secret(sessions)
    app = build_app(settings, engine=gateway_test_engine())
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(app) as client:

        def chat(key: str) -> int:
            url = "/v1/chat/completions"
            return client.post(
                url, json=body, headers={"Authorization": f"Bearer {key}"}
            ).status_code

        assert [chat("sk-clo-" + "x" * 43) for _ in range(5)] == [401] * 5
        assert [chat(suspended) for _ in range(2)] == [401] * 2
        assert [chat(narrow.secret) for _ in range(3)] == [403] * 3
        r = client.get(
            "/admin/api/v1/audit",
            params={"limit": 500},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert r.status_code == 200
        events = [
            e for e in r.json()["items"] if e["resource"] == "gateway" or e["resource"] == "fake"
        ]
    by_outcome = {e["outcome"]: e for e in events}
    assert len(events) == 2 and set(by_outcome) == {"denied:401", "denied:403"}, events
    bad = by_outcome["denied:401"]
    assert bad["detail"]["count"] == 7 and bad["detail"]["reasons"] == {
        "invalid": 5,
        "suspended": 2,
    }
    assert bad["source_ip"] == "testclient" and bad["action"] == "auth.denied"
    model = by_outcome["denied:403"]
    assert model["detail"]["count"] == 3 and model["actor"] == f"key:{narrow.id}"
    assert model["tenant_id"] == narrow.tenant_id and model["resource"] == "fake"
    close_app(app)


def test_bad_keys_from_one_source_get_429_with_retry_after(tmp_path: Path) -> None:
    settings = fake_settings(
        tmp_path, config_refresh_s=60.0, auth_failure_limit=3, auth_failure_window_s=60.0
    )
    good = tenant_keys(migrated_sessions(settings), ("acme",))["acme"]
    app = build_app(settings, engine=gateway_test_engine())
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(app) as client:

        def chat(key: str) -> Any:
            url = "/v1/chat/completions"
            return client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})

        assert chat(good).status_code == 200
        assert [chat(f"sk-clo-bad{i}").status_code for i in range(3)] == [401] * 3
        refused = chat("sk-clo-bad-next")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "too_many_auth_failures" and set(error) == {
            "message",
            "type",
            "param",
            "code",
        }
        assert chat(good).status_code == 200  # a key known to be valid still passes
    close_app(app)
