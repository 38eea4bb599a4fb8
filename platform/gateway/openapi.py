"""The OpenAPI 3.1 document of the tenant API (the gateway's OpenAI routes).

The OpenAI routes are plain Starlette routes whose bodies are validated by hand
(gateway/body.py), so FastAPI knows nothing about them. This module describes them
from the same pydantic schemas, for clients, /docs and API fuzzers. It is only a
document: nothing here runs on the request path. Every `/v1` route the app serves
must have its entry in `gateway_paths` (tests/gateway/test_openapi.py checks it
against `app.routes`). The admin API has its own document: admin/openapi.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from gateway.batch_api.openapi import MODELS as BATCH_MODELS
from gateway.batch_api.openapi import batch_paths
from gateway.schemas.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from gateway.schemas.common import ErrorBody
from gateway.schemas.completions import Completion, CompletionRequest
from gateway.schemas.models import ModelCard, ModelList
from gateway.schemas.responses import DeletedResponse, ResponseCreateRequest, ResponseObject
from server.api_docs import docs_response
from server.request_ids import describe_request_ids

REF = "#/components/schemas/{model}"
BEARER = "TenantKey"
MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    ChatCompletion,
    ChatCompletionChunk,
    CompletionRequest,
    Completion,
    ModelList,
    ModelCard,
    ErrorBody,
    ResponseCreateRequest,
    ResponseObject,
    DeletedResponse,
    *BATCH_MODELS,
)
# Statuses each kind of route can answer with an OpenAI error body.
AUTHED_ERRORS = {"401": "No, invalid, expired or revoked key", "429": "A limit was reached"}
GENERATION_ERRORS = {
    **AUTHED_ERRORS,
    "400": "Malformed body or parameter out of range",
    "403": "The key, its tenant's limits or the model's allow-list do not permit this model",
    "404": "No such model",
    "413": "The body is over the size cap",
    "503": "The engine or the limiter is unavailable; see Retry-After",
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def error_responses(statuses: dict[str, str]) -> dict[str, Any]:
    """OpenAPI `responses` for `statuses` (status -> description), each an OpenAI error
    body (`#/components/schemas/ErrorBody`); 429 and 503 with their Retry-After."""
    content = {"application/json": {"schema": _ref(ErrorBody)}}
    responses: dict[str, Any] = {}
    for status, description in sorted(statuses.items()):
        responses[status] = {"description": description, "content": content}
        if status in ("429", "503"):
            responses[status]["headers"] = {
                "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds"}
            }
    return responses


def _generation(
    summary: str, request: type[BaseModel], response: type[BaseModel], chunk: type[BaseModel]
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "tags": ["openai"],
            "security": [{BEARER: []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request)}},
            },
            "responses": {
                "200": {
                    "description": (
                        "The completion; with `stream: true`, server-sent events of "
                        f"`{chunk.__name__}` ending with `data: [DONE]`"
                    ),
                    "content": {
                        "application/json": {"schema": _ref(response)},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **error_responses(GENERATION_ERRORS),
            },
        }
    }


def _responses_paths() -> dict[str, Any]:
    """POST /v1/responses, and GET / DELETE of one stored response of the caller's tenant."""
    create = _generation(
        "Create a model response", ResponseCreateRequest, ResponseObject, ResponseObject
    )
    create["post"]["responses"]["200"]["description"] = (
        "The response; with `stream: true`, typed server-sent events (`event: <type>`) "
        "from `response.created` to `response.completed` or `response.incomplete`"
    )
    create["post"]["responses"]["404"]["description"] = (
        "No such model, or no such previous response"
    )
    one = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
    stored = error_responses({**AUTHED_ERRORS, "404": "Not stored for this tenant, or expired"})

    def operation(summary: str, body: type[BaseModel]) -> dict[str, Any]:
        return {
            "summary": summary,
            "tags": ["openai"],
            "security": [{BEARER: []}],
            "parameters": [one],
            "responses": {
                "200": {
                    "description": summary,
                    "content": {"application/json": {"schema": _ref(body)}},
                },
                **stored,
            },
        }

    return {
        "/v1/responses": create,
        "/v1/responses/{response_id}": {
            "get": operation("Retrieve a stored response", ResponseObject),
            "delete": operation("Delete a stored response", DeletedResponse),
        },
    }


def gateway_paths() -> dict[str, Any]:
    """The OpenAPI `paths` of the OpenAI-compatible routes and the health check."""
    return {
        "/v1/chat/completions": _generation(
            "Create a chat completion", ChatCompletionRequest, ChatCompletion, ChatCompletionChunk
        ),
        "/v1/completions": _generation(
            "Create a text completion", CompletionRequest, Completion, Completion
        ),
        **_responses_paths(),
        **batch_paths([{BEARER: []}], error_responses, AUTHED_ERRORS),
        "/v1/models": {
            "get": {
                "summary": "List the models this key may use",
                "tags": ["openai"],
                "security": [{BEARER: []}],
                "responses": {
                    "200": {
                        "description": "The models",
                        "content": {"application/json": {"schema": _ref(ModelList)}},
                    },
                    **error_responses(AUTHED_ERRORS),
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "summary": "Retrieve one model this key may use (404 for any other)",
                "tags": ["openai"],
                "security": [{BEARER: []}],
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {
                        "description": "The model",
                        "content": {"application/json": {"schema": _ref(ModelCard)}},
                    },
                    **error_responses({**AUTHED_ERRORS, "404": "Not served, or not allowed"}),
                },
            }
        },
        "/health": {
            "get": {
                "summary": "Liveness: the process answers and its engine serves",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "Serving"},
                    "503": {"description": "The engine is not serving"},
                },
            }
        },
    }


# The output constraints (gateway.structured_output) are read from a body's extra
# fields, so the request models do not name them: described here, for both generation
# requests. At most one per request.
CONSTRAINT_PROPERTIES: dict[str, Any] = {
    "response_format": {
        "description": 'Output format: {"type": "text"}, {"type": "json_object"}, or '
        '{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}',
        "type": "object",
        "properties": {"type": {"enum": ["text", "json_object", "json_schema"]}},
        "required": ["type"],
    },
    "guided_json": {"description": "vLLM extra: a JSON Schema the output must match"},
    "guided_regex": {"type": "string", "description": "vLLM extra: a regular expression"},
    "guided_choice": {
        "type": "array",
        "items": {"type": "string"},
        "description": "vLLM extra: the output is one of these strings",
    },
    "guided_grammar": {
        "type": "string",
        "description": "vLLM extra: a Lark grammar (llguidance's dialect)",
    },
    "structured_outputs": {
        "type": "object",
        "description": 'vLLM extra: one of {"json", "regex", "choice", "grammar", "json_object"}',
    },
}


def gateway_components() -> dict[str, Any]:
    """The schemas the paths refer to, and the tenants' bearer-key security scheme."""
    _, defs = models_json_schema([(model, "validation") for model in MODELS], ref_template=REF)
    schemas = defs.get("$defs", {})
    for request in (ChatCompletionRequest, CompletionRequest):
        schemas[request.__name__].setdefault("properties", {}).update(CONSTRAINT_PROPERTIES)
    return {
        "schemas": schemas,
        "securitySchemes": {
            BEARER: {"type": "http", "scheme": "bearer", "description": "A tenant's API key"},
        },
    }


def tenant_document(title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the tenant API: the OpenAI routes and the health check."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "The OpenAI-compatible API tenants call with their keys.",
        },
        "paths": describe_request_ids(gateway_paths()),
        "components": gateway_components(),
    }


def install_openapi(app: FastAPI) -> None:
    """Serves the tenant API's document at the app's `/openapi.json`, and a page of it at
    `/docs` (server/api_docs.py: offline, unlike Swagger UI's CDN-loaded one).

    Only the tenant API: the admin routes a `cloister serve` app also holds have their
    own document (admin/openapi.py), so a tenant's client or fuzzer never sees them.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = tenant_document(app.title, app.version)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    url = app.openapi_url or "/openapi.json"

    async def docs(request: Request) -> HTMLResponse:
        return docs_response(openapi(), url)

    app.router.routes.append(Route("/docs", docs, methods=["GET"], include_in_schema=False))
