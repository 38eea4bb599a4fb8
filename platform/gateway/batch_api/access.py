"""Who calls a files or batches route, and the audited 404 for another tenant's ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
from starlette.requests import Request

from gateway.batch_api.errors import ResourceNotFoundError
from gateway.batch_api.service import BatchApi
from gateway.errors import GatewayError, InvalidParameterError
from gateway.state import AppState, app_state, client_host
from tenancy.principal import Principal

T = TypeVar("T")


class BatchApiUnavailableError(GatewayError):
    """This gateway runs without a database, so it keeps no files or batches (404)."""

    status = 404


async def caller(request: Request) -> tuple[AppState, BatchApi, Principal]:
    """The app state, its Batch API, and the bearer key's principal."""
    state = app_state(request)
    principal = await state.auth.authenticate(
        request.headers.get("authorization"), source=client_host(request)
    )
    if state.batch_api is None:
        raise BatchApiUnavailableError(
            "this server keeps no files or batches", code="batch_api_unavailable"
        )
    return state, state.batch_api, principal


async def owned(
    request: Request, state: AppState, principal: Principal, read: Callable[[], T]
) -> T:
    """`read()` (off the loop); its not-found, which another tenant's id also gets, is
    audited as a denial, so a probe for ids leaves a trail."""
    try:
        return await anyio.to_thread.run_sync(read)
    except ResourceNotFoundError:
        state.auth.denied(
            source=client_host(request),
            principal=principal,
            reason="batch_api_not_found",
            resource=request.url.path,
            outcome="denied:404",
        )
        raise


async def owned_item(
    request: Request, param: str, read: Callable[[BatchApi, str, str], T]
) -> tuple[BatchApi, str, T]:
    """The caller's Batch API, the id in path parameter `param`, and
    `read(api, tenant_id, that id)` through `owned` (another tenant's id: an audited 404)."""
    state, api, principal = await caller(request)
    item_id: str = request.path_params[param]
    tenant_id = principal.tenant_id
    return (
        api,
        item_id,
        await owned(request, state, principal, lambda: read(api, tenant_id, item_id)),
    )


def int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high] (400 naming it otherwise)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.lstrip("-").isdigit() or len(raw) > 12:
        raise InvalidParameterError(f"{name} must be an integer", param=name)
    value = int(raw)
    if not low <= value <= high:
        raise InvalidParameterError(f"{name} must be between {low} and {high}", param=name)
    return value
