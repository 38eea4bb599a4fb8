"""/metrics on `cloister serve`'s tenant port: anonymous scrapes see no tenant, operators
(admin or viewer admin tokens) see the tenant series (issue 13, defect 14) and the prefix
cache's hits and queries, summed over tenants (issue 46)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from admin.identity import create_admin_token
from assembly.app import build_app
from server.settings import Settings
from tenancy import store
from tests.utils.built_app import chat_hi, prepared_sessions
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER

TENANT = "globex-confidential"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """`cloister serve`'s app (fast fake engine), one tenant request made; tokens by role."""
    settings = Settings(
        data_dir=tmp_path, key_pepper=PEPPER, config_refresh_s=0.0, model_name="fake-model"
    )
    sessions = prepared_sessions(settings)
    tokens: dict[str, str] = {}
    with sessions() as s:
        store.create_tenant(s, name=TENANT)
        key = store.create_key(s, tenant_name=TENANT, pepper=PEPPER).secret
        for role, tenant in (("admin", None), ("viewer", None), ("tenant-admin", TENANT)):
            tokens[role] = create_admin_token(
                s, pepper=PEPPER, role=role, tenant_name=tenant
            ).secret
    app = build_app(settings, engine=gateway_test_engine())
    try:
        with TestClient(app) as client:
            r = chat_hi(client, key, "fake-model")
            assert r.status_code == 200, r.text
            yield client, tokens
    finally:
        app.state.metering.close()


def test_anonymous_metrics_name_no_tenant(served: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = served
    r = client.get("/metrics")
    assert r.status_code == 200
    assert "vllm:num_requests_running" in r.text  # engine-level series stay public
    assert TENANT not in r.text
    assert "tenant=" not in r.text
    assert "cloister_requests" not in r.text and "cloister_limiter_rejections" not in r.text
    # Cache hits summed over every tenant are operators' too (issue 46).
    assert "vllm:prefix_cache" not in r.text


@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_operators_see_the_tenant_series(
    served: tuple[TestClient, dict[str, str]], role: str
) -> None:
    client, tokens = served
    r = client.get("/metrics", headers={"Authorization": f"Bearer {tokens[role]}"})
    assert r.status_code == 200
    assert f'cloister_requests_total{{model="fake-model",status="200",tenant="{TENANT}"}} 1.0' in (
        r.text
    )
    assert "vllm:num_requests_running" in r.text
    assert 'vllm:prefix_cache_hits_total{model_name="fake-model"}' in r.text
    assert 'vllm:prefix_cache_queries_total{model_name="fake-model"}' in r.text


def _session_without_exp() -> str:
    import base64
    import hashlib
    import hmac

    body = base64.urlsafe_b64encode(b'{"role":"admin","sub":"x","tenant":null}').rstrip(b"=")
    mac = base64.urlsafe_b64encode(hmac.new(b"k", body, hashlib.sha256).digest()).rstrip(b"=")
    return f"Bearer ses.{body.decode()}.{mac.decode()}"


@pytest.mark.parametrize(
    "credential",
    [
        "tenant-admin",
        "clo-adm-forged",
        "ses.e30.bad",
        "sk-not-an-admin-token",
        "Basic Zm9vOmJhcg==",
        b"Bearer ses.abc.\xe9",
        b"Bearer clo-adm-\xff\xfe",
        "Bearer " + "clo-adm-" + "A" * 20000,
        "Bearer ses." + "." * 50,
        "Bearer",
        _session_without_exp(),
    ],
    ids=lambda c: repr(c)[:40],
)
def test_other_credentials_are_refused(
    served: tuple[TestClient, dict[str, str]], credential: str | bytes
) -> None:
    client, tokens = served
    header: str | bytes = credential
    if isinstance(credential, str) and not credential.startswith(("Basic", "Bearer")):
        header = f"Bearer {tokens.get(credential, credential)}"
    r = client.get("/metrics", headers={"Authorization": header})
    assert r.status_code == 401
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert TENANT not in r.text
