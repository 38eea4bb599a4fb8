"""OIDC sign-in (code + PKCE) against a real provider on loopback; bad ID tokens refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from joserfc.jwk import RSAKey

from tests.admin.oidc_provider import Provider, start_provider
from tests.utils.admin_env import AdminEnv, make_env

CLIENT_ID = "cloister-admin"
REDIRECT = "http://testserver/admin/api/v1/auth/callback"


@pytest.fixture
def oidc(tmp_path: Path) -> Iterator[tuple[AdminEnv, Provider]]:
    provider, stop = start_provider(CLIENT_ID)
    env = make_env(
        tmp_path, oidc_issuer=provider.issuer, oidc_client_id=CLIENT_ID, oidc_redirect_uri=REDIRECT
    )
    yield env, provider
    env.client.close()
    stop()


def _sign_in(env: AdminEnv) -> httpx.Response:
    """Browser steps: login -> provider authorize -> callback."""
    login = env.client.get("/admin/api/v1/auth/login", follow_redirects=False)
    assert login.status_code == 302
    auth_url = login.headers["location"]
    query = parse_qs(urlparse(auth_url).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"][0]
    back = httpx.get(auth_url, follow_redirects=False)
    assert back.status_code == 302
    callback = urlparse(back.headers["location"])
    return env.client.get(f"{callback.path}?{callback.query}")


def test_sign_in_yields_a_working_session(oidc: tuple[AdminEnv, Provider]) -> None:
    env, provider = oidc
    provider.claims = {"email": "ops@example.com", "cloister_role": "viewer"}
    r = _sign_in(env)
    assert r.status_code == 200, r.text
    session = r.json()["token"]
    me = env.client.get(
        "/admin/api/v1/whoami", headers={"Authorization": f"Bearer {session}"}
    ).json()
    assert me == {"actor": "oidc:ops@example.com", "role": "viewer", "tenant_id": None}
    denied = env.client.post(
        "/admin/api/v1/tenants", json={"name": "z"}, headers={"Authorization": f"Bearer {session}"}
    )
    assert denied.status_code == 403


@pytest.mark.parametrize("fault", ["audience", "expired", "signature", "no_role", "state"])
def test_bad_id_tokens_are_refused(oidc: tuple[AdminEnv, Provider], fault: str) -> None:
    env, provider = oidc
    provider.claims = {"cloister_role": "admin"}
    if fault == "audience":
        provider.audience = "someone-else"
    elif fault == "expired":
        provider.expired = True
    elif fault == "signature":
        provider.foreign_key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    elif fault == "no_role":
        provider.claims = {}
    if fault == "state":
        env.client.get("/admin/api/v1/auth/login", follow_redirects=False)
        r = env.client.get("/admin/api/v1/auth/callback?code=x&state=forged")
    else:
        r = _sign_in(env)
    assert r.status_code == 401, r.text
    assert "token" not in r.json()
