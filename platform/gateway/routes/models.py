"""GET /v1/models: the models the caller's key may use."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.schemas.models import ModelCard, ModelList
from gateway.state import app_state, client_host
from tenancy.authenticator import allowed_models


async def list_models(request: Request) -> JSONResponse:
    """Lists the served models this key is allowed to use."""
    state = app_state(request)
    principal = await state.auth.authenticate(
        request.headers.get("authorization"), source=client_host(request)
    )
    names = allowed_models(principal, state.served_models)
    body = ModelList(
        data=[ModelCard(id=name, created=state.started_at, owned_by="cloister") for name in names]
    )
    return JSONResponse(body.model_dump())


routes = [Route("/v1/models", list_models, methods=["GET"])]
