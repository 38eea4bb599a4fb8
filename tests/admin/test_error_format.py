"""One error format for the admin API, whichever command serves it.

`cloister admin serve` (admin.app.create_admin_app) answered FastAPI's `{"detail": ...}`
with 422 for every bad value, where the same routes under `cloister serve` answered
OpenAI's `{"error": {...}}` with 400 for some bad values and 422 for others. Both
apps now share the gateway's error handlers, and a bad value is a 400 everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from admin.app import create_admin_app, make_services
from admin.identity import create_admin_token
from admin.settings import AdminSettings
from assembly.app import build_app
from assembly.database import prepare_database
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER

P = "/admin/api/v1"

# (method, path, JSON body or None, the status, the `param` it names or None)
BAD_REQUESTS: list[tuple[str, str, Any, int, str | None]] = [
    ("GET", f"{P}/tenants?offset=-1", None, 400, "offset"),  # a query parameter, by name
    ("GET", f"{P}/tenants?limit=abc", None, 400, "limit"),
    ("PUT", f"{P}/tenants/alpha/limits", {"rpm": 1.5}, 400, "rpm"),  # a body field
    ("PUT", f"{P}/tenants/alpha/limits", {"session": 1}, 400, None),  # a stray key
    ("PATCH", f"{P}/tenants/alpha", {"weight": 0}, 400, None),  # refused by the store
    ("PATCH", f"{P}/tenants/alpha", {"isolation_level": "x"}, 400, None),
    ("GET", f"{P}/usage?start=2026-01-01T00:00:00", None, 400, None),  # no time zone
    ("GET", f"{P}/billing/export?period=2026-13", None, 400, None),
    ("GET", f"{P}/billing/export?period=2026-01&format=xml", None, 400, None),
    ("GET", f"{P}/tenants/nobody", None, 404, None),
    ("GET", f"{P}/tenants/%00", None, 400, None),
    ("POST", f"{P}/tenants", "{not json", 400, None),
]


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[tuple[TestClient, TestClient, dict[str, str]]]:
    """(`cloister admin serve`'s app, `cloister serve`'s app, an admin's headers), on one
    database with one tenant, `alpha`."""
    settings = Settings(data_dir=tmp_path, key_pepper=PEPPER, model_name="fake-model")
    prepare_database(settings)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    with sessions() as s:
        store.create_tenant(s, name="alpha")
        token = create_admin_token(s, pepper=PEPPER, role="admin", name="errors").secret
    services = make_services(
        sessions, pepper=PEPPER, settings=AdminSettings.from_settings(settings)
    )
    served = build_app(settings, engine=gateway_test_engine())
    try:
        with TestClient(create_admin_app(services)) as alone, TestClient(served) as together:
            yield alone, together, {"Authorization": f"Bearer {token}"}
    finally:
        served.state.metering.close()
        services.audit_writer.close()


def _send(client: TestClient, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    if isinstance(body, str):
        headers = {**headers, "Content-Type": "application/json"}
        return client.request(method, path, content=body, headers=headers)
    return client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(("method", "path", "body", "status", "param"), BAD_REQUESTS)
def test_both_commands_answer_the_same_openai_error(
    clients: tuple[TestClient, TestClient, dict[str, str]],
    method: str,
    path: str,
    body: Any,
    status: int,
    param: str | None,
) -> None:
    alone, together, headers = clients
    answers = [_send(c, method, path, body, headers) for c in (alone, together)]
    for r in answers:
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], r.text
        if param is not None:
            assert error["param"] == param, r.text
            assert error["message"].startswith(f"{param}: "), r.text
    assert answers[0].json() == answers[1].json()


def test_no_credential_is_the_same_401_from_both(
    clients: tuple[TestClient, TestClient, dict[str, str]],
) -> None:
    alone, together, _ = clients
    answers = [c.get(f"{P}/tenants") for c in (alone, together)]
    for r in answers:
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert r.json()["error"]["message"], r.text
    assert answers[0].json() == answers[1].json()


def test_the_document_describes_the_errors_the_api_answers(
    clients: tuple[TestClient, TestClient, dict[str, str]],
) -> None:
    for client in clients[:2]:
        doc = client.get("/admin/api/openapi.json").json()
        schemas = doc["components"]["schemas"]
        assert "HTTPValidationError" not in schemas and "ErrorBody" in schemas
        error_ref = {"$ref": "#/components/schemas/ErrorBody"}
        for path, item in doc["paths"].items():
            for method, operation in item.items():
                responses = operation["responses"]
                assert "422" not in responses, (method, path)
                assert responses["400"]["content"]["application/json"]["schema"] == error_ref
                if "security" in operation:
                    assert {"401", "403", "429"} <= set(responses), (method, path)
        tenant = doc["paths"]["/admin/api/v1/tenants/{name}"]
        assert "404" in tenant["get"]["responses"] and "413" in tenant["patch"]["responses"]
