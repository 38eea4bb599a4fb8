"""The admin API's own OpenAPI 3.1 document, at /admin/api/openapi.json, and its page at
/admin/docs.

Only the admin API's routes (/admin/api/...), whichever app holds them: the admin
service alone, or `cloister serve`'s app next to the tenant API, whose document is
the gateway's (gateway/openapi.py). The routes read their credential by hand, so
FastAPI does not know they need one: they are marked as needing an admin token here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from server.api_docs import docs_response
from server.request_ids import describe_request_ids

ADMIN_API_PREFIX = "/admin/api/"
OPENAPI_URL = "/admin/api/openapi.json"
DOCS_URL = "/admin/docs"
ADMIN_BEARER = "AdminToken"
PUBLIC_ADMIN_PATHS = ("/admin/api/v1/auth/login", "/admin/api/v1/auth/callback")


def admin_document(app: FastAPI) -> dict[str, Any]:
    """The document of the admin API routes `app` serves (none of its other routes)."""
    document = get_openapi(
        title="Cloister admin API",
        version=app.version,
        openapi_version="3.1.0",
        description="Tenants, keys, limits, models, adapters, usage, billing and audit.",
        routes=app.routes,
    )
    # FastAPI describes all of its own routes (the tenant API's are plain Starlette
    # routes it never sees); keep the admin API's.
    document["paths"] = {
        path: item
        for path, item in document.get("paths", {}).items()
        if path.startswith(ADMIN_API_PREFIX)
    }
    for path, item in document.get("paths", {}).items():
        if path not in PUBLIC_ADMIN_PATHS:
            for operation in item.values():
                operation.setdefault("security", [{ADMIN_BEARER: []}])
    describe_request_ids(document.get("paths", {}))
    components = document.setdefault("components", {})
    components.setdefault("securitySchemes", {})[ADMIN_BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An admin token or a signed-in admin's session",
    }
    return document


def install_admin_openapi(app: FastAPI) -> None:
    """Serves `admin_document(app)` and its page; call once the admin routers are included.

    Built on first request, so routers included after this call are part of it.
    """
    built: list[dict[str, Any]] = []

    def document() -> dict[str, Any]:
        if not built:
            built.append(admin_document(app))
        return built[0]

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(document())

    async def docs(request: Request) -> HTMLResponse:
        return docs_response(document(), OPENAPI_URL)

    app.router.routes.append(Route(OPENAPI_URL, openapi, methods=["GET"], include_in_schema=False))
    app.router.routes.append(Route(DOCS_URL, docs, methods=["GET"], include_in_schema=False))
