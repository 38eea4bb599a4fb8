"""A tenant's API keys: list (prefixes only), create (secret once), revoke."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from sqlalchemy import select

from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, PathTenant, allow
from admin.roles import KEY_WRITE, TENANT_READ
from admin.schemas.common import Page
from admin.schemas.keys import KeyCreate, KeyCreated, KeyPublic
from admin.serialize import Limit, Offset, key_public, page
from tenancy import store
from tenancy.models import ApiKey

router = APIRouter(prefix="/tenants/{name}/keys", tags=["keys"], route_class=CappedJsonRoute)


@router.get("", dependencies=[allow(TENANT_READ)])
def list_keys(
    ctx: Ctx,
    tenant: PathTenant,
    limit: Limit = 100,
    offset: Offset = 0,
    revoked: bool | None = None,
) -> Page[KeyPublic]:
    """A tenant's keys (prefixes only; hashes and secrets are never returned)."""
    query = (
        select(ApiKey).where(ApiKey.tenant_id == tenant.id).order_by(ApiKey.created_at, ApiKey.id)
    )
    if revoked is not None:
        query = query.where(
            ApiKey.revoked_at.is_not(None) if revoked else ApiKey.revoked_at.is_(None)
        )
    return page(ctx.session, query, limit, offset, key_public)


@router.post("", status_code=201, dependencies=[allow(KEY_WRITE)])
def create_key(ctx: Ctx, name: str, tenant: PathTenant, body: KeyCreate) -> KeyCreated:
    """Creates a key; its secret is in this response only (the audit has id and prefix)."""
    created = ctx.write(
        "key.create",
        f"tenants/{name}/keys",
        lambda: store.create_key(
            ctx.session,
            tenant_name=name,
            pepper=ctx.services.pepper,
            name=body.name,
            allowed_models=body.allowed_models,
            expires_in_days=body.expires_in_days,
        ),
        tenant_id=tenant.id,
        detail=lambda k: {"id": k.id, "prefix": k.prefix, "name": body.name},
    )
    return KeyCreated(
        id=created.id, tenant_id=created.tenant_id, prefix=created.prefix, secret=created.secret
    )


@router.post("/{key_id}/revoke", dependencies=[allow(KEY_WRITE)])
def revoke_key(ctx: Ctx, tenant: PathTenant, key_id: str) -> KeyPublic:
    """Revokes one of the tenant's keys."""
    key = ctx.session.get(ApiKey, key_id)
    if key is None or key.tenant_id != tenant.id:
        raise HTTPException(404, "no such key")
    before = key_public(key)
    revoked = ctx.write(
        "key.revoke",
        f"keys/{key_id}",
        lambda: store.revoke_key(ctx.session, key_id=key_id),
        tenant_id=tenant.id,
        detail=lambda k: {
            "prefix": k.prefix,
            "before": {"status": before.status},
            "after": {"status": store.key_status(k)},
        },
    )
    return key_public(revoked)
