"""The Batch API's files: POST/GET /v1/files, GET/DELETE /v1/files/{id}, and its content."""

from __future__ import annotations

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.batch_api.access import caller, int_query, owned_item
from gateway.batch_api.content_stream import content_response
from gateway.batch_api.errors import well_formed_id
from gateway.batch_api.file_store import UPLOAD_PURPOSE
from gateway.batch_api.file_upload import receive_upload
from gateway.batch_api.schemas import FileDeleted, FileList, list_page
from gateway.batch_api.serialize import file_object
from gateway.errors import InvalidParameterError
from gateway.sse import json_model_response


async def create_file(request: Request) -> Response:
    """Uploads a JSONL file of batch requests (purpose "batch"), within the caps."""
    _, api, principal = await caller(request)
    files = api.files
    await anyio.to_thread.run_sync(files.check_room, principal.tenant_id)
    staged = await anyio.to_thread.run_sync(files.staging_path)
    try:
        upload = await receive_upload(
            request,
            staged,
            max_bytes=files.limits.max_file_bytes,
            max_lines=files.limits.max_file_lines,
        )
        if upload.purpose != UPLOAD_PURPOSE:
            raise InvalidParameterError(
                f"purpose must be {UPLOAD_PURPOSE!r}: this server keeps batch input files only",
                param="purpose",
            )
        if upload.size == 0:
            raise InvalidParameterError("the file is empty", param="file")
        info = await anyio.to_thread.run_sync(
            lambda: files.add(
                principal.tenant_id,
                filename=upload.filename,
                purpose=UPLOAD_PURPOSE,
                staged=staged,
                size=upload.size,
                lines=upload.lines,
            )
        )
    finally:
        await anyio.to_thread.run_sync(lambda: staged.unlink(missing_ok=True))
    return json_model_response(file_object(info))


async def list_files(request: Request) -> Response:
    """The caller's files, newest first by default."""
    _, api, principal = await caller(request)
    limit = int_query(request, "limit", 10_000, 1, 10_000)
    purpose = request.query_params.get("purpose")
    if purpose is not None and not well_formed_id(purpose):
        raise InvalidParameterError("purpose is not a file purpose", param="purpose")
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidParameterError("order must be 'asc' or 'desc'", param="order")
    page, more = await anyio.to_thread.run_sync(
        lambda: api.files.page(
            principal.tenant_id,
            purpose=purpose,
            limit=limit,
            after=request.query_params.get("after"),
            order=order,
        )
    )
    return json_model_response(list_page(FileList, [file_object(f) for f in page], more))


async def retrieve_file(request: Request) -> Response:
    """One of the caller's files (404 for any other id)."""
    _, _, info = await owned_item(request, "file_id", lambda api, t, f: api.files.get(t, f))
    return json_model_response(file_object(info))


async def file_content(request: Request) -> Response:
    """The bytes of one of the caller's files."""
    _, _, (info, stream) = await owned_item(
        request, "file_id", lambda api, t, f: api.files.open_content(t, f)
    )
    return content_response(info, stream)


async def delete_file(request: Request) -> Response:
    """Deletes one of the caller's files."""
    _, file_id, _ = await owned_item(request, "file_id", lambda api, t, f: api.files.delete(t, f))
    return json_model_response(FileDeleted(id=file_id))


routes = [
    Route("/v1/files", create_file, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", retrieve_file, methods=["GET"]),
    Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
]
