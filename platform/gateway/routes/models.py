"""GET /v1/models and /v1/models/{model}: the served models the caller may use (its key,
its tenant's limits and each model's registry allow-list), and after each the
"base:adapter" entries of the LoRA adapters its tenant may use (its own and public
ones) that the model's engine has loaded."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.errors import ModelNotFoundError
from gateway.model_access import AccessSnapshot
from gateway.schemas.models import ModelCard, ModelList
from gateway.state import AppState, app_state, client_host
from tenancy.authenticator import allowed_models
from tenancy.principal import Principal


async def _allowed_cards(request: Request) -> list[ModelCard]:
    state = app_state(request)
    principal = await state.auth.authenticate(
        request.headers.get("authorization"), source=client_host(request)
    )
    if state.model_access is None:  # no registry: no allow-lists, and no adapters
        names = allowed_models(principal, state.served_models)
    else:
        access = await state.model_access.current()
        names = []
        for model in state.served_models:
            if not access.allows(model, principal.tenant_id):
                continue
            if key_allows(principal, model):
                names.append(model)
            entries = _adapter_entries(state, access, model, principal.tenant_id)
            names.extend(e for e in entries if key_allows(principal, model, e))
    return [ModelCard(id=name, created=state.started_at, owned_by="cloister") for name in names]


def key_allows(principal: Principal, model: str, entry: str | None = None) -> bool:
    """Whether the key's (and its tenant's) model list lets it use `model`, or the adapter
    `entry` ("model:adapter") when the list names that entry itself."""
    names = principal.allowed_models
    return names is None or model in names or (entry is not None and entry in names)


def _adapter_entries(
    state: AppState, access: AccessSnapshot, model: str, tenant_id: str
) -> list[str]:
    """`model`'s loaded adapters the registry lets `tenant_id` use, as "model:adapter"."""
    loaded = sorted(a.name for a in state.engine_for(model).adapters())
    entries = [f"{model}:{name}" for name in loaded]
    return [e for e in entries if e in access.allowed and access.allows(e, tenant_id)]


async def list_models(request: Request) -> JSONResponse:
    """Lists the served models this key is allowed to use."""
    return JSONResponse(ModelList(data=await _allowed_cards(request)).model_dump())


async def retrieve_model(request: Request) -> JSONResponse:
    """One served model this key may use; 404 otherwise, also for one it may not use,
    so that a key learns nothing of the models it is not allowed."""
    name = request.path_params["model"]
    for card in await _allowed_cards(request):
        if card.id == name:
            return JSONResponse(card.model_dump())
    raise ModelNotFoundError(
        f"the model {name!r} does not exist", param="model", code="model_not_found"
    )


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    # :path, since model names may hold a slash (org/name)
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
]
