"""Shared prefixes in the public cache domain: list, publish, withdraw."""

from __future__ import annotations

from fastapi import APIRouter

from admin import registry
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, allow
from admin.roles import PLATFORM_READ, PLATFORM_WRITE
from admin.schemas.common import ItemList
from admin.schemas.prefixes import PrefixCreate, PrefixPublic
from admin.serialize import prefix_public

router = APIRouter(prefix="/prefixes", tags=["prefixes"], route_class=CappedJsonRoute)


@router.get("", dependencies=[allow(PLATFORM_READ)])
def list_prefixes(ctx: Ctx, model: str | None = None) -> ItemList[PrefixPublic]:
    """Published shared prefixes."""
    items = [prefix_public(p) for p in registry.list_prefixes(ctx.session, model=model)]
    return ItemList[PrefixPublic](items=items, total=len(items))


@router.post("", status_code=201, dependencies=[allow(PLATFORM_WRITE)])
def publish_prefix(ctx: Ctx, body: PrefixCreate) -> PrefixPublic:
    """Publishes a shared prefix into the public cache domain."""
    p = ctx.write(
        "prefix.publish",
        f"prefixes/{body.name}",
        lambda: registry.publish_prefix(
            ctx.session, name=body.name, model=body.model, token_ids=body.token_ids, text=body.text
        ),
        detail=lambda p: {"model": p.model, "id": p.id},
    )
    return prefix_public(p)


@router.delete("/{name}", dependencies=[allow(PLATFORM_WRITE)])
def withdraw_prefix(ctx: Ctx, name: str) -> PrefixPublic:
    """Withdraws a published prefix: the running engines stop sharing it within the
    config refresh interval."""
    p = ctx.write(
        "prefix.withdraw",
        f"prefixes/{name}",
        lambda: registry.withdraw_prefix(ctx.session, name=name),
        detail=lambda p: {"model": p.model, "id": p.id},
    )
    return prefix_public(p)
