"""The admin API's own OpenAPI document and docs page, and x-request-id on its answers,
the same id as its audit record."""

from __future__ import annotations

from typing import Any

from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator

from tests.utils.admin_env import AdminEnv


def test_admin_document_is_its_own(env: AdminEnv) -> None:
    r = env.client.get("/admin/api/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    validate(doc, cls=OpenAPIV31SpecValidator)
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["title"] == "Cloister admin API"
    paths = set(doc["paths"])
    assert {"/admin/api/v1/tenants", "/admin/api/v1/usage", "/admin/api/v1/audit"} <= paths
    assert all(p.startswith("/admin/api/") for p in paths), sorted(paths)
    assert doc["paths"]["/admin/api/v1/tenants"]["get"]["security"] == [{"AdminToken": []}]
    assert "security" not in doc["paths"]["/admin/api/v1/auth/login"]["get"]
    assert set(doc["components"]["securitySchemes"]) == {"AdminToken"}
    # The standalone admin service has no other document.
    assert env.client.get("/openapi.json").status_code == 404


def test_admin_docs_page(env: AdminEnv) -> None:
    r = env.client.get("/admin/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/admin/api/v1/tenants" in r.text and "<script" not in r.text
    assert 'href="/admin/api/openapi.json"' in r.text


def test_admin_answers_name_the_request_as_audited(env: AdminEnv) -> None:
    headers = env.token("admin")
    r = env.client.post(
        "/admin/api/v1/tenants", json={"name": "gamma"}, headers={**headers, "x-request-id": "op-1"}
    )
    assert r.status_code == 201 and r.headers["x-request-id"] == "op-1"
    plain = env.client.post("/admin/api/v1/tenants", json={"name": "delta"}, headers=headers)
    own = plain.headers["x-request-id"]
    assert own == plain.headers["x-cloister-request-id"] and own != "op-1"
    denied = env.client.get("/admin/api/v1/tenants", headers={"Authorization": "Bearer bad"})
    assert denied.status_code == 401 and denied.headers["x-request-id"]
    events = env.client.get("/admin/api/v1/audit?action=tenant.create", headers=headers).json()
    by_resource = {e["resource"]: e["request_id"] for e in events["items"]}
    assert by_resource["tenants/gamma"] == "op-1"
    assert by_resource["tenants/delta"] == own
