"""The Batch API's part of the tenant API's OpenAPI document (gateway/openapi.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.batch_api.schemas import (
    BatchCreateRequest,
    BatchList,
    BatchObject,
    FileDeleted,
    FileList,
    FileObject,
)

REF = "#/components/schemas/{model}"
MODELS: tuple[type[BaseModel], ...] = (
    FileObject,
    FileList,
    FileDeleted,
    BatchCreateRequest,
    BatchObject,
    BatchList,
)
OWNED_404 = "No such file or batch of this tenant (another tenant's ids included)"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def batch_paths(
    security: list[dict[str, list[str]]],
    errors: Any,
    authed: dict[str, str],
) -> dict[str, Any]:
    """The files and batches paths; `errors(statuses)` builds the error responses."""

    def op(
        summary: str,
        body: type[BaseModel] | None,
        statuses: dict[str, str],
        *,
        parameters: list[dict[str, Any]] | None = None,
        content: dict[str, Any] | None = None,
        request: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if content is None:
            assert body is not None, "give the response body's model or its content"
            content = {"application/json": {"schema": _ref(body)}}
        operation: dict[str, Any] = {
            "summary": summary,
            "tags": ["batch"],
            "security": security,
            "responses": {
                "200": {"description": summary, "content": content},
                **errors({**authed, **statuses}),
            },
        }
        if parameters:
            operation["parameters"] = parameters
        if request is not None:
            operation["requestBody"] = request
        return operation

    upload = {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                    "required": ["file", "purpose"],
                }
            }
        },
    }
    create = {
        "required": True,
        "content": {"application/json": {"schema": _ref(BatchCreateRequest)}},
    }
    file_id, batch_id = _path_param("file_id"), _path_param("batch_id")
    return {
        "/v1/files": {
            "post": op(
                "Upload a JSONL file of batch requests",
                FileObject,
                {
                    "400": "Not multipart, no file, or purpose not 'batch'",
                    "413": "Over the size or line cap",
                },
                request=upload,
            ),
            "get": op(
                "List this tenant's files",
                FileList,
                {"400": "A bad query parameter"},
                parameters=[
                    _query("purpose", {"type": "string"}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
                    _query("after", {"type": "string"}),
                    _query("order", {"type": "string", "enum": ["asc", "desc"]}),
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "get": op("Retrieve a file", FileObject, {"404": OWNED_404}, parameters=[file_id]),
            "delete": op("Delete a file", FileDeleted, {"404": OWNED_404}, parameters=[file_id]),
        },
        "/v1/files/{file_id}/content": {
            "get": op(
                "Download a file's bytes",
                None,
                {"404": OWNED_404},
                parameters=[file_id],
                content={
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            ),
        },
        "/v1/batches": {
            "post": op(
                "Create a batch",
                BatchObject,
                {
                    "400": "A bad field, an empty input file or repeated custom_ids",
                    "404": OWNED_404,
                },
                request=create,
            ),
            "get": op(
                "List this tenant's batches",
                BatchList,
                {"400": "A bad query parameter"},
                parameters=[
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    _query("after", {"type": "string"}),
                ],
            ),
        },
        "/v1/batches/{batch_id}": {
            "get": op("Retrieve a batch", BatchObject, {"404": OWNED_404}, parameters=[batch_id]),
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": op(
                "Cancel a batch",
                BatchObject,
                {"404": OWNED_404, "409": "The batch already ended"},
                parameters=[batch_id],
            ),
        },
    }
