"""Hostile input to the admin API: every malformed value is a clear 4xx, never a 500."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from admin.models import AuditEvent
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import AdminEnv

P = "/admin/api/v1"


def _forged_session(env: AdminEnv, payload: Any) -> str:
    """A session token correctly signed with the session key, over any payload."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    secret = env.services.session_key
    key = hashlib.sha256(b"cloister-admin-session:" + secret.encode()).digest()
    body = b64(json.dumps(payload).encode())
    mac = b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    return f"ses.{body}.{mac}"


def _denials(env: AdminEnv) -> int:
    env.services.audit_writer.flush()  # denials are written in the background
    with env.sessions() as s:
        return s.query(AuditEvent).filter(AuditEvent.outcome == "denied:401").count()


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer ses.abc.\xe9",
        b"Bearer ses.\xe9\xe9.abc",
        b"Bearer clo-adm-\xe9",
    ],
)
def test_non_ascii_bearer_is_an_audited_401(env: AdminEnv, authorization: bytes) -> None:
    before = _denials(env)
    r = env.client.get(f"{P}/tenants", headers={"Authorization": authorization})  # type: ignore[dict-item]
    assert r.status_code == 401, r.text
    assert _denials(env) == before + 1


@pytest.mark.parametrize(
    "payload",
    [
        {"sub": "mallory", "role": "admin", "tenant": None},  # no exp: would never expire
        {"sub": "mallory", "role": "admin", "tenant": None, "exp": "never"},
        {"sub": "mallory", "role": ["admin"], "tenant": None, "exp": 4102444800},
        {"sub": "mallory", "role": "tenant-admin", "tenant": None, "exp": 4102444800},
        {"role": "admin", "tenant": None, "exp": 4102444800},
        ["not", "an", "object"],
    ],
)
def test_signed_session_with_a_bad_payload_is_401(env: AdminEnv, payload: Any) -> None:
    r = env.client.get(
        f"{P}/whoami", headers={"Authorization": f"Bearer {_forged_session(env, payload)}"}
    )
    assert r.status_code == 401, r.text


def test_signed_session_with_a_good_payload_still_works(env: AdminEnv) -> None:
    token = _forged_session(
        env, {"sub": "alice", "role": "viewer", "tenant": None, "exp": 4102444800}
    )
    r = env.client.get(f"{P}/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json()["actor"] == "alice"


@pytest.mark.parametrize("cookie", [b"cloister_oidc=\xe9\xe9.abc", b"cloister_oidc=abc.\xe9"])
def test_non_ascii_oidc_cookie_is_401(env: AdminEnv, cookie: bytes) -> None:
    r = env.client.get(
        f"{P}/auth/callback?code=c&state=s",
        headers={"Cookie": cookie},  # type: ignore[dict-item]
    )
    assert r.status_code == 401, r.text


@pytest.mark.parametrize("days", [1e10, "Infinity", 1e308, -1, 0])
def test_key_expiry_out_of_range_is_400(env: AdminEnv, days: Any) -> None:
    body = f'{{"expires_in_days": {days}}}'
    r = env.client.post(
        f"{P}/tenants/alpha/keys",
        content=body,
        headers={**env.token("admin"), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert "expires" in r.text


@pytest.mark.parametrize(
    "body",
    [
        {"session": 1},
        {"tenant_name": "beta"},
        {"key_id": "x"},
        {"nonsense": 5},
        {"rpm": 10**30},
        {"tpm": 2**31},
        {"rpm": 1.5},
        {"rpm": True},
    ],
)
def test_limits_body_with_stray_keys_or_huge_values_is_400(
    env: AdminEnv, body: dict[str, Any]
) -> None:
    r = env.client.put(f"{P}/tenants/alpha/limits", json=body, headers=env.token("admin"))
    assert r.status_code == 400, r.text
    ok = env.client.put(f"{P}/tenants/alpha/limits", json={"rpm": 5}, headers=env.token("admin"))
    assert ok.status_code == 200 and ok.json()["rpm"] == 5


@pytest.mark.parametrize("value", [0, -1, 10**9, "x", True, 2**31, 1.5])
def test_tokens_in_flight_limit_bad_values_are_400_by_name(env: AdminEnv, value: Any) -> None:
    admin = env.token("admin")
    r = env.client.put(
        f"{P}/tenants/alpha/limits", json={"max_tokens_in_flight": value}, headers=admin
    )
    if value == 10**9:  # an integer limit up to 2**31 - 1, as the other limits
        assert r.status_code == 200 and r.json()["max_tokens_in_flight"] == value
        return
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "max_tokens_in_flight" in (err["param"] or err["message"])
    ok = env.client.put(
        f"{P}/tenants/alpha/limits", json={"max_tokens_in_flight": 4096}, headers=admin
    )
    assert ok.status_code == 200 and ok.json()["max_tokens_in_flight"] == 4096
    cleared = env.client.put(
        f"{P}/tenants/alpha/limits", json={"max_tokens_in_flight": None}, headers=admin
    )
    assert cleared.status_code == 200 and cleared.json()["max_tokens_in_flight"] is None


@pytest.mark.parametrize("value", [0, -1, 10**9, 10**7 + 1, "x", True, 1.5])
def test_tenant_max_output_tokens_bad_values_are_400_by_name(env: AdminEnv, value: Any) -> None:
    admin = env.token("admin")
    r = env.client.put(
        f"{P}/tenants/alpha/limits", json={"max_output_tokens": value}, headers=admin
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "max_output_tokens" in (err["param"] or err["message"])
    ok = env.client.put(f"{P}/tenants/alpha/limits", json={"max_output_tokens": 256}, headers=admin)
    assert ok.status_code == 200 and ok.json()["max_output_tokens"] == 256


@pytest.mark.parametrize("value", [0, -1, 10**9, "x", True, 513, 10**7 + 1, 1.5, "64"])
def test_model_max_output_tokens_bad_values_are_400_by_name(env: AdminEnv, value: Any) -> None:

    with env.sessions() as s:
        register_stand_in(s, "tiny", context_length=512)
    admin = env.token("admin")
    r = env.client.patch(f"{P}/models/tiny", json={"max_output_tokens": value}, headers=admin)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "max_output_tokens" in (err["param"] or err["message"])
    assert env.client.get(f"{P}/models/tiny", headers=admin).json()["max_output_tokens"] is None
    ok = env.client.patch(f"{P}/models/tiny", json={"max_output_tokens": 512}, headers=admin)
    assert ok.status_code == 200 and ok.json()["max_output_tokens"] == 512
    # Absent keeps it; null gives the cap back to the context length.
    kept = env.client.patch(f"{P}/models/tiny", json={"status": "loaded"}, headers=admin)
    assert kept.json()["max_output_tokens"] == 512
    cleared = env.client.patch(f"{P}/models/tiny", json={"max_output_tokens": None}, headers=admin)
    assert cleared.status_code == 200 and cleared.json()["max_output_tokens"] is None


@pytest.mark.parametrize("path", ["tokens", "tenants", "models", "adapters", "audit"])
@pytest.mark.parametrize("offset", ["1e23", str(2**70), "-1"])
def test_page_offset_out_of_range_is_400(env: AdminEnv, path: str, offset: str) -> None:
    # Found by schemathesis: an offset past 64 bits reached SQLite as an OverflowError.
    r = env.client.get(f"{P}/{path}?offset={offset}", headers=env.token("admin"))
    assert r.status_code == 400, r.text
    assert "offset" in r.text


@pytest.mark.parametrize("period", ["9999-12", "9999-12-31", "2026-13", "abc", "2026-02-30"])
def test_billing_period_out_of_range_is_400(env: AdminEnv, period: str) -> None:
    r = env.client.get(f"{P}/billing/export?period={period}", headers=env.token("admin"))
    assert r.status_code == 400, r.text
    assert "period" in r.text


@pytest.mark.parametrize(
    "body",
    [
        {"name": "a/b"},
        {"name": "nul\x00name"},
        {"name": "-leading-dash"},
        {"name": "x" * 64},
        {"name": "ok", "weight": "Infinity"},
        {"name": "ok", "weight": 1e-300},
        {"name": "ok", "weight": 1000},
        {"name": "ok", "weight": 0},
    ],
)
def test_tenant_name_and_weight_are_validated(env: AdminEnv, body: dict[str, Any]) -> None:
    raw = json.dumps(body).replace('"Infinity"', "Infinity")
    r = env.client.post(
        f"{P}/tenants",
        content=raw,
        headers={**env.token("admin"), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert env.client.get(f"{P}/tenants/ok", headers=env.token("admin")).status_code == 404


def test_key_name_length_is_bounded(env: AdminEnv) -> None:
    admin = env.token("admin")
    r = env.client.post(f"{P}/tenants/alpha/keys", json={"name": "k" * 129}, headers=admin)
    assert r.status_code == 400, r.text
    r = env.client.post(f"{P}/tenants/alpha/keys", json={"name": "k" * 128}, headers=admin)
    assert r.status_code == 201, r.text


def test_expired_key_is_listed_as_expired(env: AdminEnv) -> None:
    import datetime as dt

    from tenancy.models import ApiKey

    admin = env.token("admin")
    kid = env.client.post(f"{P}/tenants/alpha/keys", json={}, headers=admin).json()["id"]
    live = env.client.post(f"{P}/tenants/alpha/keys", json={}, headers=admin).json()["id"]
    with env.sessions() as s:
        key = s.get(ApiKey, kid)
        assert key is not None
        key.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        s.commit()
    env.client.post(f"{P}/tenants/alpha/keys/{live}/revoke", headers=admin)
    items = env.client.get(f"{P}/tenants/alpha/keys", headers=admin).json()["items"]
    assert {k["id"]: k["status"] for k in items} == {kid: "expired", live: "revoked"}


def test_json_body_with_content_length_over_the_cap_is_413(env: AdminEnv) -> None:
    from admin.body_cap import MAX_JSON_BODY_BYTES

    headers = {
        **env.token("admin"),
        "Content-Type": "application/json",
        "Content-Length": str(10**9),
    }
    r = env.client.post(f"{P}/tenants", content=b'{"name": "liar"}', headers=headers)
    assert r.status_code == 413, r.text
    big = b'{"name": "big", "pad": "' + b"x" * MAX_JSON_BODY_BYTES + b'"}'

    def chunks() -> Any:
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    r = env.client.post(
        f"{P}/tenants",
        content=chunks(),
        headers={**env.token("admin"), "Content-Type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert env.client.get(f"{P}/tenants/big", headers=env.token("admin")).status_code == 404
    ok = env.client.post(f"{P}/tenants", json={"name": "fine"}, headers=env.token("admin"))
    assert ok.status_code == 201, ok.text


def test_admin_body_is_cut_off_at_the_cap_while_streaming() -> None:
    import asyncio

    from fastapi import HTTPException
    from starlette.requests import Request

    from admin.body_cap import MAX_JSON_BODY_BYTES, CappedRequest

    sent = [0]
    chunk = b"x" * 65536

    async def receive() -> dict[str, Any]:
        sent[0] += 1
        return {"type": "http.request", "body": chunk, "more_body": sent[0] < 10_000}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    with pytest.raises(HTTPException) as err:
        asyncio.run(CappedRequest(scope, receive).body())
    assert err.value.status_code == 413
    assert sent[0] == MAX_JSON_BODY_BYTES // len(chunk) + 1
    assert isinstance(CappedRequest(scope, receive), Request)


@pytest.mark.parametrize(
    "body",
    [
        b'{"name": "' + b"[" * 5000 + b'"}',
        b'{"name": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"name": "a", "weight": ' + b"9" * 5000 + b"}",
        b'{"name": "\\ud800"}',
    ],
)
def test_malformed_admin_json_is_a_4xx(env: AdminEnv, body: bytes) -> None:
    r = env.client.post(
        f"{P}/tenants",
        content=body,
        headers={**env.token("admin"), "Content-Type": "application/json"},
    )
    assert 400 <= r.status_code < 500, r.text


@pytest.mark.parametrize("weight", ["Infinity", "1e-300", "1000", "0"])
def test_console_weight_setting_is_bounded(env: AdminEnv, weight: str) -> None:
    r = env.client.patch(
        f"{P}/tenants/alpha/settings",
        content=f'{{"weight": {weight}}}',
        headers={**env.token("admin"), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    tenant = env.client.get(f"{P}/tenants/alpha", headers=env.token("admin")).json()
    assert tenant["weight"] == 1.0


def test_admin_token_name_length_is_bounded(env: AdminEnv) -> None:
    admin = env.token("admin")
    r = env.client.post(f"{P}/tokens", json={"role": "viewer", "name": "t" * 129}, headers=admin)
    assert r.status_code == 400, r.text
    r = env.client.post(f"{P}/tokens", json={"role": "viewer", "name": "t" * 128}, headers=admin)
    assert r.status_code == 201, r.text
