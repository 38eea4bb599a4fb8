"""Admin API routes the console needs beyond router.py: tenant settings, audit search, config."""

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException
from sqlalchemy import select

from admin.audit_log import event_dict
from admin.body_cap import CappedJsonRoute
from admin.deps import AdminContext, AdminServices, context_dependency
from admin.models import AuditEvent
from admin.router import PREFIX, TenantPolicy, _tenant
from admin.serialize import Limit, Offset, page, tenant_dict
from tenancy import store
from tenancy.errors import TenancyError
from tenancy.store import ISOLATION_LEVELS


class TenantSettings(TenantPolicy):
    """Isolation level, scheduling weight and cache policy; absent fields keep their
    value, null clears an optional policy field (the engine default)."""

    isolation_level: str | None = None


def _iso_utc(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise HTTPException(422, "times need a time zone")
    # Audit times are stored as ISO text in UTC, so text order is time order.
    return value.astimezone(dt.UTC).isoformat(timespec="microseconds")


def create_console_router(services: AdminServices) -> APIRouter:
    """Routes for tenant settings, audit search and the console's sign-in options."""
    router = APIRouter(prefix=PREFIX, tags=["admin"], route_class=CappedJsonRoute)
    Ctx = Annotated[AdminContext, Depends(context_dependency(services))]

    @router.get("/console/config")
    def console_config() -> dict[str, Any]:
        """Public sign-in options (no secrets): whether OIDC is configured."""
        s = services.settings
        return {"oidc": bool(s.oidc_issuer and s.oidc_client_id)}

    @router.patch("/tenants/{name}/settings")
    def update_settings(ctx: Ctx, name: str, body: TenantSettings) -> dict[str, Any]:
        """Changes a tenant's isolation level, weight and cache policy."""
        ctx.require("admin")
        tenant = _tenant(ctx, name)
        if body.isolation_level is not None and body.isolation_level not in ISOLATION_LEVELS:
            ctx.audit("tenant.settings", f"tenants/{name}", outcome="error", tenant_id=tenant.id)
            raise HTTPException(422, f"isolation must be one of {', '.join(ISOLATION_LEVELS)}")
        if body.isolation_level is not None:
            tenant.isolation_level = body.isolation_level
        changes = body.changes()
        try:
            store.update_tenant(ctx.session, name=name, **changes)  # commits both
        except TenancyError as exc:
            ctx.session.rollback()
            ctx.audit("tenant.settings", f"tenants/{name}", outcome="error", tenant_id=tenant.id)
            raise HTTPException(422, str(exc)) from exc
        detail = {**changes, **body.model_dump(include={"isolation_level"}, exclude_none=True)}
        ctx.audit("tenant.settings", f"tenants/{name}", tenant_id=tenant.id, **detail)
        return tenant_dict(tenant)

    @router.get("/audit/search")
    def search_audit(
        ctx: Ctx,
        limit: Limit = 100,
        offset: Offset = 0,
        actor: str | None = None,
        tenant_id: str | None = None,
        action: str | None = None,
        outcome: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> dict[str, Any]:
        """Audit records, newest first, filtered by actor, tenant, action (prefix) and time."""
        ctx.require("admin", "viewer")
        services.audit_writer.flush()  # what was queued before this call is in the answer
        e = AuditEvent
        query = select(e).order_by(e.seq.desc())
        if actor:
            query = query.where(e.actor.contains(actor))
        if tenant_id:
            query = query.where(e.tenant_id == tenant_id)
        if action:
            query = query.where(e.action.startswith(action))
        if outcome:
            query = query.where(e.outcome.startswith(outcome))
        start, end = _iso_utc(since), _iso_utc(until)
        if start:
            query = query.where(e.at >= start)
        if end:
            query = query.where(e.at < end)
        return page(ctx.session, query, limit, offset, event_dict)

    return router
