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
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from gateway.openapi import REF, error_responses
from gateway.schemas.common import ErrorBody
from server.api_docs import docs_response
from server.request_ids import describe_request_ids

ADMIN_API_PREFIX = "/admin/api/"
OPENAPI_URL = "/admin/api/openapi.json"
DOCS_URL = "/admin/docs"
ADMIN_BEARER = "AdminToken"
PUBLIC_ADMIN_PATHS = ("/admin/api/v1/auth/login", "/admin/api/v1/auth/callback")
# What every admin operation can answer besides its success, each an OpenAI error body
# (gateway/errors.py serves them, in `cloister serve` and `cloister admin serve` alike).
INPUT_ERRORS = {
    "400": "A malformed body, parameter or value",
    "429": "Too many failed sign-ins from this address",
}
AUTHED_ERRORS = {
    **INPUT_ERRORS,
    "401": "No, invalid or expired admin token or session",
    "403": "The caller's role does not allow this",
}
NAMED_ERRORS = {"404": "No such resource, or not one the caller may see"}
BODY_ERRORS = {"413": "The body is over the size cap"}
# FastAPI's own description of a validation failure, which these apps never answer.
FASTAPI_VALIDATION_STATUS = "422"
FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


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
        public = path in PUBLIC_ADMIN_PATHS
        errors = {
            **(INPUT_ERRORS if public else AUTHED_ERRORS),
            **(NAMED_ERRORS if "{" in path else {}),
        }
        for operation in item.values():
            if not public:
                operation.setdefault("security", [{ADMIN_BEARER: []}])
            responses = operation.setdefault("responses", {})
            responses.pop(FASTAPI_VALIDATION_STATUS, None)
            body = BODY_ERRORS if "requestBody" in operation else {}
            responses.update(error_responses({**errors, **body}))
    describe_request_ids(document.get("paths", {}))
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(unused, None)
    _, defs = models_json_schema([(ErrorBody, "validation")], ref_template=REF)
    schemas.update(defs.get("$defs", {}))
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
