"""Admin API tokens: list (prefixes only), create (secret once), revoke. Admin only writes."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, allow
from admin.identity import create_admin_token, revoke_admin_token
from admin.models import AdminToken
from admin.roles import ADMIN_ONLY, TOKEN_READ
from admin.schemas.common import Page
from admin.schemas.tokens import TokenCreate, TokenCreated, TokenPublic
from admin.serialize import Limit, Offset, page, token_public

router = APIRouter(prefix="/tokens", tags=["tokens"], route_class=CappedJsonRoute)


@router.get("", dependencies=[allow(TOKEN_READ)])
def list_tokens(ctx: Ctx, limit: Limit = 100, offset: Offset = 0) -> Page[TokenPublic]:
    """Admin tokens by prefix."""
    query = select(AdminToken).order_by(AdminToken.created_at)
    return page(ctx.session, query, limit, offset, token_public)


@router.post("", status_code=201, dependencies=[allow(ADMIN_ONLY)])
def create_token(ctx: Ctx, body: TokenCreate) -> TokenCreated:
    """Creates an admin token; the secret is in this response only (the audit: id, prefix)."""
    created = ctx.write(
        "token.create",
        f"tokens/{body.role}",
        lambda: create_admin_token(
            ctx.session,
            pepper=ctx.services.pepper,
            role=body.role,
            tenant_name=body.tenant,
            name=body.name,
        ),
        detail=lambda c: {"id": c.id, "role": c.role, "tenant_id": c.tenant_id, "name": body.name},
    )
    return TokenCreated(
        id=created.id, role=created.role, tenant_id=created.tenant_id, token=created.secret
    )


@router.post("/{token_id}/revoke", dependencies=[allow(ADMIN_ONLY)])
def revoke_token(ctx: Ctx, token_id: str) -> TokenPublic:
    """Revokes an admin token."""
    row = ctx.write(
        "token.revoke",
        f"tokens/{token_id}",
        lambda: revoke_admin_token(ctx.session, token_id=token_id),
        detail=lambda t: {"id": t.id, "prefix": t.prefix, "role": t.role},
    )
    return token_public(row)
