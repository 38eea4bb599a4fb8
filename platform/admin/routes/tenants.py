"""Tenants: list, create, read, status and policy updates, settings."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping

from fastapi import APIRouter, HTTPException
from sqlalchemy import select

from admin.audit_diff import changed
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, PathTenant, allow
from admin.engine_view import EngineReplicas
from admin.roles import PLATFORM_WRITE, TENANT_LIST, TENANT_READ, USAGE_READ
from admin.routes.engines import Replicas
from admin.schemas.common import Page
from admin.schemas.overview import SpendPeriod
from admin.schemas.tenants import (
    BudgetPublic,
    TenantCreate,
    TenantPublic,
    TenantSettings,
    TenantSpend,
    TenantUpdate,
)
from admin.serialize import Limit, Offset, page, tenant_public
from admin.spend import budget_use, today_and_month
from tenancy import store
from tenancy.errors import InvalidValueError, TenancyError
from tenancy.models import Tenant
from tenancy.store import ISOLATION_LEVELS

router = APIRouter(prefix="/tenants", tags=["tenants"], route_class=CappedJsonRoute)


def _check_quota_fits_pool(changes: Mapping[str, object], replicas: EngineReplicas | None) -> None:
    """A KV quota no engine of this process could ever reach is a mistake: refused with
    the pool's size. Against the largest pool, so that each quota accepted binds on some
    engine; without an engine (the admin service alone) only the store's range applies."""
    quota = changes.get("kv_quota_blocks")
    if isinstance(quota, bool) or not isinstance(quota, int) or replicas is None:
        return
    pools = [s.snapshot.num_blocks for states in replicas().values() for s in states]
    pool = max((n for n in pools if n > 0), default=None)
    if pool is not None and quota > pool:
        raise InvalidValueError(
            f"kv_quota_blocks ({quota}) is larger than the KV pool of the engines "
            f"this process serves ({pool} blocks)"
        )


@router.get("", dependencies=[allow(TENANT_LIST)])
def list_tenants(
    ctx: Ctx,
    limit: Limit = 100,
    offset: Offset = 0,
    status: str | None = None,
    name_contains: str | None = None,
) -> Page[TenantPublic]:
    """Tenants, paginated; a tenant-admin sees only its own."""
    query = select(Tenant).order_by(Tenant.name)
    if ctx.identity.role == "tenant-admin":
        query = query.where(Tenant.id == ctx.identity.tenant_id)
    if status:
        query = query.where(Tenant.status == status)
    if name_contains:
        query = query.where(Tenant.name.contains(name_contains))
    return page(ctx.session, query, limit, offset, tenant_public)


@router.post("", status_code=201, dependencies=[allow(PLATFORM_WRITE)])
def create_tenant(ctx: Ctx, body: TenantCreate) -> TenantPublic:
    """Creates a tenant."""
    return ctx.write_new(
        "tenant.create",
        f"tenants/{body.name}",
        lambda: store.create_tenant(
            ctx.session,
            name=body.name,
            isolation_level=body.isolation_level,
            weight=body.weight,
            stream_cadence=body.stream_cadence,
        ),
        tenant_public,
    )


@router.get("/{name}", dependencies=[allow(TENANT_READ)])
def get_tenant(tenant: PathTenant) -> TenantPublic:
    """One tenant."""
    return tenant_public(tenant)


@router.get("/{name}/spend", dependencies=[allow(USAGE_READ)])
def get_tenant_spend(ctx: Ctx, tenant: PathTenant) -> TenantSpend:
    """The tenant's requests, tokens and spend today and this month, and its token budget use."""
    now = dt.datetime.now(dt.UTC)
    today, month = today_and_month(ctx.session, now=now, tenant_id=tenant.id)
    limits = store.get_limits(ctx.session, tenant_name=tenant.name)
    budget = budget_use(ctx.session, now=now, tenant_id=tenant.id, limits=limits)
    return TenantSpend(
        today=SpendPeriod(**dataclasses.asdict(today)),
        month=SpendPeriod(**dataclasses.asdict(month)),
        budget=BudgetPublic(**dataclasses.asdict(budget)) if budget else None,
    )


@router.patch("/{name}", dependencies=[allow(PLATFORM_WRITE)])
def update_tenant(
    ctx: Ctx, name: str, tenant: PathTenant, body: TenantUpdate, replicas: Replicas
) -> TenantPublic:
    """Suspends or resumes a tenant and/or changes its weight and cache policy (the
    running engine follows within the config refresh interval)."""
    before = tenant_public(tenant)
    changes = body.changes()

    def apply() -> Tenant:
        # Both checked before either commits: a refused body changes nothing.
        if body.status not in (None, "active", "suspended"):
            raise InvalidValueError("status must be active or suspended")
        _check_quota_fits_pool(changes, replicas)
        t = store.update_tenant(ctx.session, name=name, **changes)
        if body.status is not None:
            t = store.set_tenant_status(ctx.session, name=name, status=body.status)
        return t

    requested = {**changes, **({"status": body.status} if body.status is not None else {})}
    ctx.write(
        "tenant.update",
        f"tenants/{name}",
        apply,
        tenant_id=tenant.id,
        detail=lambda t: {**requested, **changed(before, tenant_public(t))},
    )
    return tenant_public(tenant)


@router.patch("/{name}/settings", dependencies=[allow(PLATFORM_WRITE)])
def update_settings(
    ctx: Ctx, name: str, tenant: PathTenant, body: TenantSettings, replicas: Replicas
) -> TenantPublic:
    """Changes a tenant's isolation level, weight and cache policy."""
    before = tenant_public(tenant)
    if body.isolation_level is not None and body.isolation_level not in ISOLATION_LEVELS:
        ctx.audit("tenant.settings", f"tenants/{name}", outcome="error", tenant_id=tenant.id)
        raise HTTPException(400, f"isolation must be one of {', '.join(ISOLATION_LEVELS)}")
    if body.isolation_level is not None:
        tenant.isolation_level = body.isolation_level
    changes = body.changes()
    try:
        _check_quota_fits_pool(changes, replicas)
        store.update_tenant(ctx.session, name=name, **changes)  # commits both
    except TenancyError as exc:
        ctx.session.rollback()
        ctx.audit("tenant.settings", f"tenants/{name}", outcome="error", tenant_id=tenant.id)
        raise HTTPException(400, str(exc)) from exc
    after = tenant_public(tenant)
    requested = {**changes, **body.model_dump(include={"isolation_level"}, exclude_none=True)}
    detail = {**requested, **changed(before, after)}
    ctx.audit("tenant.settings", f"tenants/{name}", tenant_id=tenant.id, detail=detail)
    return after
