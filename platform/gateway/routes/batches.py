"""The Batch API's batches: POST/GET /v1/batches, GET /v1/batches/{id}, and its cancel."""

from __future__ import annotations

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.batch_api.access import caller, int_query, owned, owned_item
from gateway.batch_api.batch_lines import survey
from gateway.batch_api.file_store import UPLOAD_PURPOSE
from gateway.batch_api.schemas import BatchCreateRequest, BatchList, list_page
from gateway.batch_api.serialize import batch_object
from gateway.body import parse_body
from gateway.errors import InvalidParameterError
from gateway.sse import json_model_response


async def create_batch(request: Request) -> Response:
    """Creates a batch over an uploaded file; its lines run in the background."""
    state, api, principal = await caller(request)
    body = await parse_body(request, BatchCreateRequest)
    try:
        metadata = body.checked_metadata()
    except ValueError as exc:
        raise InvalidParameterError(str(exc), param="metadata") from None
    tenant = principal.tenant_id
    info = await owned(request, state, principal, lambda: api.files.get(tenant, body.input_file_id))
    if info.purpose != UPLOAD_PURPOSE:
        raise InvalidParameterError(
            f"the input file's purpose is {info.purpose!r}, not {UPLOAD_PURPOSE!r}",
            param="input_file_id",
        )
    _, stream = await anyio.to_thread.run_sync(api.files.open_content, tenant, body.input_file_id)
    found = await anyio.to_thread.run_sync(survey, stream, body.endpoint)  # closes the stream
    if found.lines == 0:
        raise InvalidParameterError("the input file has no lines", param="input_file_id")
    if found.duplicate_custom_ids:
        sample = ", ".join(sorted(found.duplicate_custom_ids)[:3])
        raise InvalidParameterError(
            f"custom_id must be unique within a batch; repeated: {sample}",
            param="input_file_id",
            code="duplicate_custom_id",
        )
    batch = await anyio.to_thread.run_sync(
        lambda: api.batches.create(
            tenant_id=tenant,
            key_id=principal.key_id,
            endpoint=body.endpoint,
            input_file_id=body.input_file_id,
            completion_window=body.completion_window,
            metadata=metadata,
            total_lines=found.lines,
            estimated_tokens=found.estimated_tokens,
            max_queued_tokens=api.max_queued_tokens,
        )
    )
    api.runner.wake()
    return json_model_response(batch_object(batch))


async def list_batches(request: Request) -> Response:
    """The caller's batches, newest first."""
    _, api, principal = await caller(request)
    limit = int_query(request, "limit", 20, 1, 100)
    after = request.query_params.get("after")
    page, more = await anyio.to_thread.run_sync(
        lambda: api.batches.page(principal.tenant_id, limit=limit, after=after)
    )
    return json_model_response(list_page(BatchList, [batch_object(b) for b in page], more))


async def retrieve_batch(request: Request) -> Response:
    """One of the caller's batches, with its progress."""
    _, _, info = await owned_item(request, "batch_id", lambda api, t, b: api.batches.get(t, b))
    return json_model_response(batch_object(info))


async def cancel_batch(request: Request) -> Response:
    """Cancels one of the caller's batches: lines in flight finish, no new line starts."""
    api, _, info = await owned_item(request, "batch_id", lambda api, t, b: api.batches.cancel(t, b))
    api.runner.wake()
    return json_model_response(batch_object(info))


routes = [
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", retrieve_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]
