"""A model's fallback under overload through the admin API (issue 42 item 3): set on
register and update, cleared with null, audited, and refused with a 400 in the admin
API's error format for an unknown model, the model itself or a cycle."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from admin import registry
from admin.audit_log import event_dict
from admin.models import AuditEvent
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import AdminEnv

P = "/admin/api/v1"


def _events(env: AdminEnv, action: str) -> list[dict[str, Any]]:
    env.services.audit_writer.flush()
    with env.sessions() as s:
        rows = s.scalars(select(AuditEvent).order_by(AuditEvent.seq)).all()
        return [event_dict(r) for r in rows if r.action == action]


@pytest.fixture
def admin(env: AdminEnv) -> dict[str, str]:
    """An admin's headers, with models big, small and tiny registered (no fallbacks)."""
    with env.sessions() as s:
        for name in ("big", "small", "tiny"):
            register_stand_in(s, name, context_length=512)
    return env.token("admin")


def _fallback(env: AdminEnv, admin: dict[str, str], model: str) -> Any:
    r = env.client.get(f"{P}/models/{model}", headers=admin)
    assert r.status_code == 200, r.text
    return r.json()["fallback_model"]


def test_set_keep_and_clear_a_fallback_audited(env: AdminEnv, admin: dict[str, str]) -> None:
    assert _fallback(env, admin, "big") is None
    r = env.client.patch(f"{P}/models/big", json={"fallback_model": "small"}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["fallback_model"] == "small"
    # A change of something else keeps it.
    r = env.client.patch(f"{P}/models/big", json={"max_output_tokens": 64}, headers=admin)
    assert r.status_code == 200 and r.json()["fallback_model"] == "small"
    listed = env.client.get(f"{P}/models", headers=admin).json()["items"]
    assert {m["name"]: m["fallback_model"] for m in listed} == {
        "big": "small",
        "small": None,
        "tiny": None,
    }
    r = env.client.patch(f"{P}/models/big", json={"fallback_model": None}, headers=admin)
    assert r.status_code == 200 and r.json()["fallback_model"] is None
    first, _cap, cleared = _events(env, "model.update")
    assert first["detail"] == {
        "before": {"fallback_model": None},
        "after": {"fallback_model": "small"},
    }
    assert cleared["detail"] == {
        "before": {"fallback_model": "small"},
        "after": {"fallback_model": None},
    }


def test_register_with_a_fallback(env: AdminEnv, admin: dict[str, str]) -> None:
    (env.tmp / "models" / "m.gguf").write_bytes(b"GGUF")
    body = {
        "name": "huge",
        "source": str(env.tmp / "models" / "m.gguf"),
        "format": "gguf",
        "context_length": 512,
    }
    r = env.client.post(f"{P}/models", json={**body, "fallback_model": "big"}, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["fallback_model"] == "big" and _fallback(env, admin, "huge") == "big"
    (registered,) = _events(env, "model.register")
    assert registered["detail"]["after"]["fallback_model"] == "big"
    r = env.client.post(
        f"{P}/models", json={**body, "name": "other", "fallback_model": "ghost"}, headers=admin
    )
    assert r.status_code == 400 and "ghost" in r.json()["error"]["message"]
    assert env.client.get(f"{P}/models/other", headers=admin).status_code == 404


@pytest.mark.parametrize(
    ("chain", "model", "fallback", "words"),
    [
        ([], "big", "ghost", ("no model named", "ghost")),
        ([], "big", "big", ("own fallback",)),
        ([("small", "big")], "big", "small", ("cycle",)),  # big -> small -> big
        ([("small", "tiny"), ("tiny", "big")], "big", "small", ("cycle",)),  # a longer one
        ([], "big", "", ("fallback_model",)),
    ],
)
def test_bad_fallbacks_are_400_audited_and_change_nothing(
    env: AdminEnv,
    admin: dict[str, str],
    chain: list[tuple[str, str]],
    model: str,
    fallback: str,
    words: tuple[str, ...],
) -> None:
    for a, b in chain:
        ok = env.client.patch(f"{P}/models/{a}", json={"fallback_model": b}, headers=admin)
        assert ok.status_code == 200, ok.text
    r = env.client.patch(f"{P}/models/{model}", json={"fallback_model": fallback}, headers=admin)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error["message"]
    assert _fallback(env, admin, model) is None
    refused = _events(env, "model.update")[-1]
    assert refused["outcome"] == "error"


def test_a_chain_without_a_cycle_is_allowed(env: AdminEnv, admin: dict[str, str]) -> None:
    # The gateway moves a request once, so big -> small -> tiny is two separate choices.
    for a, b in (("small", "tiny"), ("big", "small")):
        ok = env.client.patch(f"{P}/models/{a}", json={"fallback_model": b}, headers=admin)
        assert ok.status_code == 200, ok.text
    with env.sessions() as s:
        assert registry.fallbacks(s) == {"big": "small", "small": "tiny"}


def test_a_viewer_may_not_set_a_fallback(env: AdminEnv, admin: dict[str, str]) -> None:
    viewer = env.token("viewer")
    r = env.client.patch(f"{P}/models/big", json={"fallback_model": "small"}, headers=viewer)
    assert r.status_code == 403
    assert _fallback(env, admin, "big") is None
