"""Rows as JSON-ready dicts (never a hash or a secret), and offset pagination."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Query
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from admin import registry
from admin.models import AdminToken, LoraAdapter, RegisteredModel, SharedPrefix, UsageRow
from tenancy import store
from tenancy.models import ApiKey, Tenant

# The largest offset a page may start at: past a 64-bit integer SQLite raises an
# OverflowError (a 500); no table here comes near 2**31 rows.
MAX_OFFSET = 2**31 - 1
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def page(
    session: Session,
    query: Select[Any],
    limit: int,
    offset: int,
    fn: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """One page of `query` and the total count."""
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    rows = session.scalars(query.limit(limit).offset(offset)).all()
    return {"items": [fn(r) for r in rows], "total": int(total), "limit": limit, "offset": offset}


def tenant_dict(t: Tenant) -> dict[str, Any]:
    """A tenant."""
    return {
        "id": t.id,
        "name": t.name,
        "status": t.status,
        "isolation_level": t.isolation_level,
        "weight": t.weight,
        "cache_floor_blocks": t.cache_floor_blocks,
        "cache_floor_share": t.cache_floor_share,
        "retention_ttl_s": t.retention_ttl_s,
        "scrub_on_free": t.scrub_on_free,
        "never_cache": bool(t.never_cache),
        "created_at": _iso(t.created_at),
    }


def key_dict(k: ApiKey) -> dict[str, Any]:
    """A key by its display prefix; the hash stays in the database."""
    return {
        "id": k.id,
        "tenant_id": k.tenant_id,
        "prefix": k.prefix,
        "name": k.name,
        "allowed_models": k.allowed_models,
        "created_at": _iso(k.created_at),
        "expires_at": _iso(k.expires_at),
        "revoked_at": _iso(k.revoked_at),
        "last_used_at": _iso(k.last_used_at),
        "status": store.key_status(k),
    }


def model_dict(session: Session, m: RegisteredModel, *, history: bool = False) -> dict[str, Any]:
    """A model with its current price (None: unpriced) and its price history on request."""
    prices = registry.price_history(session, model=m.name)
    out: dict[str, Any] = {
        "id": m.id,
        "name": m.name,
        "revision": m.revision,
        "source": m.source,
        "format": m.format,
        "context_length": m.context_length,
        "status": m.status,
        "allowed_tenants": m.allowed_tenants,  # tenant ids; None: every tenant
        "device": m.device,  # where the server that loaded it runs it; None unless loaded
        "dtype": m.dtype,
        "created_at": _iso(m.created_at),
    }
    rows = [
        {
            "effective_from": _iso(p.effective_from),
            "input_price": p.input_micros_per_m,
            "cached_input_price": p.cached_input_micros_per_m,
            "output_price": p.output_micros_per_m,
        }
        for p in prices
    ]
    out["price"] = rows[-1] if rows else None
    if history:
        out["price_history"] = rows
    return out


def adapter_dict(a: LoraAdapter) -> dict[str, Any]:
    """A LoRA adapter."""
    return {
        "id": a.id,
        "name": a.name,
        "base_model": a.base_model,
        "owner_tenant_id": a.owner_tenant_id,
        "rank": a.rank,
        "source_path": a.source_path,
        "status": a.status,
        "created_at": _iso(a.created_at),
    }


def prefix_dict(p: SharedPrefix) -> dict[str, Any]:
    """A published shared prefix."""
    return {
        "id": p.id,
        "name": p.name,
        "model": p.model,
        "token_ids": p.token_ids,
        "text": p.text,
        "created_at": _iso(p.created_at),
    }


def token_dict(t: AdminToken) -> dict[str, Any]:
    """An admin token by its prefix."""
    return {
        "id": t.id,
        "name": t.name,
        "role": t.role,
        "tenant_id": t.tenant_id,
        "prefix": t.prefix,
        "created_at": _iso(t.created_at),
        "revoked_at": _iso(t.revoked_at),
    }


def usage_record_dict(u: UsageRow) -> dict[str, Any]:
    """One request's usage record, with the gateway's and the client's request ids."""
    return {
        "request_id": u.request_id,
        "client_request_id": u.client_request_id,
        "occurred_at": _iso(u.occurred_at),
        "tenant_id": u.tenant_id,
        "key_id": u.key_id,
        "model": u.model,
        "adapter": u.adapter or None,
        "prompt_tokens": u.prompt_tokens,
        "cached_tokens": u.cached_tokens,
        "completion_tokens": u.completion_tokens,
        "cost_pico_usd": u.cost_pico_usd,
        "status": u.status,
        "finish_reason": u.finish_reason,
        "client_disconnected": u.client_disconnected,
    }
