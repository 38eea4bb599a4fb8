"""Registered models: list, register (source under the model roots), read, update, price."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from admin import registry
from admin.audit_diff import changed
from admin.body_cap import CappedJsonRoute
from admin.deps import AdminContext, Ctx, allow, http_error
from admin.models import RegisteredModel
from admin.roles import PLATFORM_READ, PLATFORM_WRITE
from admin.schemas.common import Page
from admin.schemas.models import ModelCreate, ModelDetail, ModelPublic, ModelUpdate, PriceCreate
from admin.serialize import Limit, Offset, model_detail, model_public, price_public
from tenancy.errors import NotFoundError

router = APIRouter(prefix="/models", tags=["models"], route_class=CappedJsonRoute)


def _model(ctx: AdminContext, name: str) -> RegisteredModel:
    try:
        return registry.get_model(ctx.session, name)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc


@router.get("", dependencies=[allow(PLATFORM_READ)])
def list_models(
    ctx: Ctx, limit: Limit = 100, offset: Offset = 0, status: str | None = None
) -> Page[ModelPublic]:
    """Registered models with their current prices."""
    rows = registry.list_models(ctx.session, status=status)
    items = [model_public(ctx.session, m) for m in rows[offset : offset + limit]]
    return Page[ModelPublic](items=items, total=len(rows), limit=limit, offset=offset)


@router.post("", status_code=201, dependencies=[allow(PLATFORM_WRITE)])
def register_model(ctx: Ctx, body: ModelCreate) -> ModelPublic:
    """Registers a model with its first price; its source must lie under the model roots."""
    ctx.check_source(body.source, "model.register", f"models/{body.name}")
    prices = body.prices()
    return ctx.write_new(
        "model.register",
        f"models/{body.name}",
        lambda: registry.register_model(
            ctx.session,
            name=body.name,
            source=body.source,
            format=body.format,
            context_length=body.context_length,
            revision=body.revision,
            prices=prices,
            allowed_tenants=body.allowed_tenants,
            fallback_model=body.fallback_model,
        ),
        lambda m: model_public(ctx.session, m),
    )


@router.get("/{name}", dependencies=[allow(PLATFORM_READ)])
def get_model(ctx: Ctx, name: str) -> ModelDetail:
    """One model with its price history."""
    return model_detail(ctx.session, _model(ctx, name))


@router.patch("/{name}", dependencies=[allow(PLATFORM_WRITE)])
def update_model(ctx: Ctx, name: str, body: ModelUpdate) -> ModelPublic:
    """Changes status (registered, loaded, retired), the tenant allow-list, the model's
    `max_output_tokens` (null: its context length) or its `fallback_model` (null: none;
    a 400 for an unknown model, the model itself or a cycle)."""
    try:
        before: ModelPublic | None = model_public(
            ctx.session, registry.get_model(ctx.session, name)
        )
    except NotFoundError:  # the write below refuses it (404, audited)
        before = None
    m = ctx.write(
        "model.update",
        f"models/{name}",
        lambda: registry.update_model(
            ctx.session,
            name=name,
            status=body.status,
            allowed_tenants=body.allowed_tenants,
            clear_allowed_tenants=body.clear_allowed_tenants,
            max_output_tokens=(
                body.max_output_tokens
                if "max_output_tokens" in body.model_fields_set
                else registry.KEEP
            ),
            fallback_model=(
                body.fallback_model if "fallback_model" in body.model_fields_set else registry.KEEP
            ),
        ),
        detail=lambda m: changed(before, model_public(ctx.session, m)) if before else {},
    )
    return model_public(ctx.session, m)


@router.post("/{name}/prices", status_code=201, dependencies=[allow(PLATFORM_WRITE)])
def set_price(ctx: Ctx, name: str, body: PriceCreate) -> ModelDetail:
    """Adds a price from `effective_from`; usage before it keeps the old price."""
    prices = registry.Prices(
        body.input_price, body.cached_input_price, body.output_price, body.batch_discount_pct
    )
    try:
        old = model_public(ctx.session, registry.get_model(ctx.session, name)).price
    except NotFoundError as exc:  # audited like any refused write
        ctx.audit("model.price", f"models/{name}/prices", outcome="error")
        raise http_error(exc) from exc
    ctx.write(
        "model.price",
        f"models/{name}/prices",
        lambda: registry.set_price(
            ctx.session,
            model=name,
            prices=prices,
            effective_from=body.effective_from,
            adapter=body.adapter,
        ),
        detail=lambda row: {
            "before": {"price": old.model_dump(mode="json") if old else None},
            "after": {"price": price_public(row).model_dump(mode="json")},
        },
    )
    return model_detail(ctx.session, _model(ctx, name))
