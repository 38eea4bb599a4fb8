"""Every admin API response is described by a schema; secrets only in `*Created` ones."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from admin.router import create_admin_router
from tests.utils.admin_env import AdminEnv

TEXT_ROUTES = {("get", "/billing/export"), ("get", "/audit/export")}  # CSV / JSON lines
REDIRECTS = {("get", "/auth/login")}
SECRET_FIELDS = {"secret", "token", "secret_hash", "pepper", "password"}


def _document(env: AdminEnv) -> dict[str, Any]:
    app = FastAPI()
    app.include_router(create_admin_router(env.services))
    return app.openapi()


def test_every_json_route_has_a_response_model(env: AdminEnv) -> None:
    doc = _document(env)
    missing = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            key = (method, path.removeprefix("/admin/api/v1"))
            if key in REDIRECTS:
                continue
            ok = next(v for code, v in op["responses"].items() if code.startswith("2"))
            content = ok.get("content", {})
            if key in TEXT_ROUTES:
                assert set(content) >= {"application/x-ndjson"}, key
                continue
            schema = content.get("application/json", {}).get("schema", {})
            if "$ref" not in schema:
                missing.append(key)
    assert missing == []


def test_secrets_appear_only_in_created_schemas(env: AdminEnv) -> None:
    schemas = _document(env)["components"]["schemas"]
    holders = {
        name
        for name, schema in schemas.items()
        if SECRET_FIELDS & set(schema.get("properties", {}))
    }
    assert holders == {"KeyCreated", "TokenCreated", "SessionCreated"}
