"""Rows as the API's public schemas (never a hash or a secret), and offset pagination.

`tenant_public(t).model_dump(mode="json")` is the one JSON form of a tenant; the CLI
may print it as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Query
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from admin import registry
from admin.models import (
    AdminToken,
    LoraAdapter,
    ModelPrice,
    RegisteredModel,
    SharedPrefix,
    UsageRow,
)
from admin.schemas.adapters import AdapterPublic
from admin.schemas.common import Page
from admin.schemas.keys import KeyPublic
from admin.schemas.limits import LimitsPublic
from admin.schemas.models import ModelDetail, ModelPublic, PricePublic
from admin.schemas.prefixes import PrefixPublic
from admin.schemas.tenants import TenantPublic
from admin.schemas.tokens import TokenPublic
from admin.schemas.usage import UsageRecordPublic
from server.field_copy import copy_fields
from tenancy import store
from tenancy.limits import EffectiveLimits
from tenancy.models import ApiKey, Tenant

# The largest offset a page may start at: past a 64-bit integer SQLite raises an
# OverflowError (a 500); no table here comes near 2**31 rows.
MAX_OFFSET = 2**31 - 1
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
T = TypeVar("T")


def page(
    session: Session,
    query: Select[Any],
    limit: int,
    offset: int,
    fn: Callable[[Any], T],
) -> Page[T]:
    """One page of `query`, each row through `fn`, and the total count."""
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    rows = session.scalars(query.limit(limit).offset(offset)).all()
    return Page[T](items=[fn(r) for r in rows], total=int(total), limit=limit, offset=offset)


def tenant_public(t: Tenant) -> TenantPublic:
    """A tenant."""
    return copy_fields(TenantPublic, t, never_cache=bool(t.never_cache))


def tenant_dict(t: Tenant) -> dict[str, Any]:
    """A tenant as JSON-ready data (the public schema's JSON form)."""
    return tenant_public(t).model_dump(mode="json")


def key_public(k: ApiKey) -> KeyPublic:
    """A key by its display prefix; the hash stays in the database."""
    return copy_fields(KeyPublic, k, status=store.key_status(k))


def limits_public(limits: EffectiveLimits) -> LimitsPublic:
    """The limits in force, sets as sorted lists."""
    out = dataclasses.asdict(limits)
    out["allowed_models"] = (
        sorted(limits.allowed_models) if limits.allowed_models is not None else None
    )
    out["key_scoped"] = sorted(limits.key_scoped)
    return LimitsPublic(**out)


def price_public(p: ModelPrice) -> PricePublic:
    """One price of a model."""
    return PricePublic(
        effective_from=p.effective_from,
        input_price=p.input_micros_per_m,
        cached_input_price=p.cached_input_micros_per_m,
        output_price=p.output_micros_per_m,
        batch_discount_pct=p.batch_discount_pct,
        adapter=p.adapter or None,
    )


def _prices(session: Session, model: str) -> list[PricePublic]:
    return [price_public(p) for p in registry.price_history(session, model=model)]


def model_public(session: Session, m: RegisteredModel) -> ModelPublic:
    """A model with its current price (None: unpriced)."""
    prices = _prices(session, m.name)
    return copy_fields(ModelPublic, m, price=prices[-1] if prices else None)


def model_detail(session: Session, m: RegisteredModel) -> ModelDetail:
    """A model with its current price and its whole price history."""
    prices = _prices(session, m.name)
    return copy_fields(ModelDetail, m, price=prices[-1] if prices else None, price_history=prices)


def adapter_public(a: LoraAdapter) -> AdapterPublic:
    """A LoRA adapter."""
    return copy_fields(AdapterPublic, a)


def prefix_public(p: SharedPrefix) -> PrefixPublic:
    """A published shared prefix."""
    return copy_fields(PrefixPublic, p)


def token_public(t: AdminToken) -> TokenPublic:
    """An admin token by its prefix."""
    return copy_fields(TokenPublic, t)


def usage_record_public(u: UsageRow) -> UsageRecordPublic:
    """One request's usage record, with the gateway's and the client's request ids."""
    return copy_fields(UsageRecordPublic, u, adapter=u.adapter or None)
