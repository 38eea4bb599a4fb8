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
    return TenantPublic(
        id=t.id,
        name=t.name,
        status=t.status,
        isolation_level=t.isolation_level,
        weight=t.weight,
        cache_floor_blocks=t.cache_floor_blocks,
        cache_floor_share=t.cache_floor_share,
        retention_ttl_s=t.retention_ttl_s,
        scrub_on_free=t.scrub_on_free,
        never_cache=bool(t.never_cache),
        kv_quota_blocks=t.kv_quota_blocks,
        stream_cadence=t.stream_cadence,
        created_at=t.created_at,
    )


def tenant_dict(t: Tenant) -> dict[str, Any]:
    """A tenant as JSON-ready data (the public schema's JSON form)."""
    return tenant_public(t).model_dump(mode="json")


def key_public(k: ApiKey) -> KeyPublic:
    """A key by its display prefix; the hash stays in the database."""
    return KeyPublic(
        id=k.id,
        tenant_id=k.tenant_id,
        prefix=k.prefix,
        name=k.name,
        allowed_models=k.allowed_models,
        created_at=k.created_at,
        expires_at=k.expires_at,
        revoked_at=k.revoked_at,
        last_used_at=k.last_used_at,
        status=store.key_status(k),
    )


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


def _model_fields(m: RegisteredModel) -> dict[str, Any]:
    return {
        "id": m.id,
        "name": m.name,
        "revision": m.revision,
        "source": m.source,
        "format": m.format,
        "context_length": m.context_length,
        "status": m.status,
        "allowed_tenants": m.allowed_tenants,
        "device": m.device,
        "dtype": m.dtype,
        "max_output_tokens": m.max_output_tokens,
        "family": m.family,
        "quantization": m.quantization,
        "fallback_model": m.fallback_model,
        "created_at": m.created_at,
    }


def model_public(session: Session, m: RegisteredModel) -> ModelPublic:
    """A model with its current price (None: unpriced)."""
    prices = _prices(session, m.name)
    return ModelPublic(**_model_fields(m), price=prices[-1] if prices else None)


def model_detail(session: Session, m: RegisteredModel) -> ModelDetail:
    """A model with its current price and its whole price history."""
    prices = _prices(session, m.name)
    return ModelDetail(
        **_model_fields(m), price=prices[-1] if prices else None, price_history=prices
    )


def adapter_public(a: LoraAdapter) -> AdapterPublic:
    """A LoRA adapter."""
    return AdapterPublic(
        id=a.id,
        name=a.name,
        base_model=a.base_model,
        owner_tenant_id=a.owner_tenant_id,
        rank=a.rank,
        source_path=a.source_path,
        status=a.status,
        created_at=a.created_at,
    )


def prefix_public(p: SharedPrefix) -> PrefixPublic:
    """A published shared prefix."""
    return PrefixPublic(
        id=p.id,
        name=p.name,
        model=p.model,
        token_ids=p.token_ids,
        text=p.text,
        created_at=p.created_at,
    )


def token_public(t: AdminToken) -> TokenPublic:
    """An admin token by its prefix."""
    return TokenPublic(
        id=t.id,
        name=t.name,
        role=t.role,
        tenant_id=t.tenant_id,
        prefix=t.prefix,
        created_at=t.created_at,
        revoked_at=t.revoked_at,
    )


def usage_record_public(u: UsageRow) -> UsageRecordPublic:
    """One request's usage record, with the gateway's and the client's request ids."""
    return UsageRecordPublic(
        request_id=u.request_id,
        client_request_id=u.client_request_id,
        occurred_at=u.occurred_at,
        tenant_id=u.tenant_id,
        key_id=u.key_id,
        model=u.model,
        adapter=u.adapter or None,
        prompt_tokens=u.prompt_tokens,
        cached_tokens=u.cached_tokens,
        completion_tokens=u.completion_tokens,
        cost_pico_usd=u.cost_pico_usd,
        status=u.status,
        finish_reason=u.finish_reason,
        client_disconnected=u.client_disconnected,
        batch=u.batch,
    )
