"""The OIDC and session settings, set as CLOISTER_ADMIN_* variables, reach the running
admin app's sign-in; a bad value stops the server before it starts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import click
import httpx
import pytest
from fastapi.testclient import TestClient

from admin.settings import AdminSettings
from cloister.commands.serve import load_settings
from tenancy.db import upgrade_database
from tests.admin.oidc_provider import Provider, start_provider
from tests.utils.admin_app import admin_app_from_settings

CLIENT_ID = "cloister-admin"
REDIRECT = "http://testserver/admin/api/v1/auth/callback"
SESSION = "/admin/api/v1/whoami"

Serve = Callable[..., TestClient]


@pytest.fixture
def provider() -> Iterator[Provider]:
    """An OpenID provider on a loopback port."""
    running, stop = start_provider(CLIENT_ID)
    yield running
    stop()


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: Provider) -> Iterator[Serve]:
    """serve(NAME=value, ...): the admin app as `cloister admin serve` builds it from the
    environment, with the issuer and those CLOISTER_ADMIN_* variables set."""
    clients: list[TestClient] = []

    def start(**variables: str) -> TestClient:
        env = {
            "CLOISTER_DATA_DIR": str(tmp_path / "data"),
            "CLOISTER_DATABASE_URL": f"sqlite:///{tmp_path / 'admin.db'}",
            "CLOISTER_ADMIN_OIDC_ISSUER": provider.issuer,
            "CLOISTER_ADMIN_OIDC_CLIENT_ID": CLIENT_ID,
            "CLOISTER_ADMIN_OIDC_REDIRECT_URI": REDIRECT,
            **{f"CLOISTER_ADMIN_{k.upper()}": v for k, v in variables.items()},
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = load_settings()
        upgrade_database(settings.resolved_database_url)
        _, client = admin_app_from_settings(settings)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()


def _login(client: TestClient) -> str:
    """The issuer URL the console's sign-in redirects to."""
    login = client.get("/admin/api/v1/auth/login", follow_redirects=False)
    assert login.status_code == 302, login.text
    return str(login.headers["location"])


def _sign_in(client: TestClient) -> httpx.Response:
    """Browser steps: login -> provider authorize -> callback."""
    back = httpx.get(_login(client), follow_redirects=False)
    assert back.status_code == 302, back.text
    callback = urlparse(back.headers["location"])
    return client.get(f"{callback.path}?{callback.query}")


def _whoami(client: TestClient, session: str) -> httpx.Response:
    return client.get(SESSION, headers={"Authorization": f"Bearer {session}"})


def test_scopes_reach_the_issuer(serve: Serve) -> None:
    client = serve(oidc_scopes="openid email groups")
    assert parse_qs(urlparse(_login(client)).query)["scope"] == ["openid email groups"]


def test_role_claim_is_read_from_the_named_claim(serve: Serve, provider: Provider) -> None:
    client = serve(oidc_role_claim="https://example.com/role")
    provider.claims = {"https://example.com/role": "operator", "cloister_role": "admin"}
    r = _sign_in(client)
    assert r.status_code == 200, r.text
    assert r.json()["role"] == "operator"  # the default claim's "admin" is not read


def test_tenant_claim_is_read_from_the_named_claim(serve: Serve, provider: Provider) -> None:
    client = serve(oidc_tenant_claim="org")
    provider.claims = {"cloister_role": "tenant-admin", "org": "ten_acme"}
    r = _sign_in(client)
    assert r.status_code == 200, r.text
    me = _whoami(client, r.json()["token"]).json()
    assert (me["role"], me["tenant_id"]) == ("tenant-admin", "ten_acme")


def test_default_role_signs_in_a_token_without_a_role(serve: Serve, provider: Provider) -> None:
    client = serve(oidc_default_role="viewer")
    provider.claims = {"email": "ops@example.com"}  # no role claim
    r = _sign_in(client)
    assert r.status_code == 200, r.text
    assert _whoami(client, r.json()["token"]).json()["role"] == "viewer"


def test_session_ttl_bounds_the_console_session(
    serve: Serve, provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = serve(session_ttl_s="120")
    provider.claims = {"cloister_role": "viewer"}
    signed_in_at = time.time()
    r = _sign_in(client)
    assert r.status_code == 200, r.text
    session = r.json()["token"]
    later = SimpleNamespace(time=lambda: signed_in_at + 110)
    monkeypatch.setattr("admin.identity.time", later)
    assert _whoami(client, session).status_code == 200
    later.time = lambda: signed_in_at + 130  # within the default 8 hours, past 120 s
    assert _whoami(client, session).status_code == 401


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("oidc_scopes", "email profile", "must include openid"),
        ("oidc_role_claim", "", "at least 1 character"),
        ("oidc_tenant_claim", "", "at least 1 character"),
        ("oidc_default_role", "superuser", "'admin', 'operator'"),
        ("session_ttl_s", "30", "greater than or equal to 60"),
        ("session_ttl_s", "eight hours", "valid integer"),
    ],
)
def test_a_bad_value_stops_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(f"CLOISTER_ADMIN_{variable.upper()}", value)
    with pytest.raises(click.ClickException) as refused:
        load_settings()
    assert f"admin_{variable}: " in refused.value.message
    assert message in refused.value.message


def test_an_empty_default_role_is_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_ADMIN_OIDC_DEFAULT_ROLE", "")
    assert AdminSettings.from_settings(load_settings()).oidc_default_role is None
