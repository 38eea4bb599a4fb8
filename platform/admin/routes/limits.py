"""The limits of a tenant or one of its keys: read the limits in force, set fields."""

from __future__ import annotations

from fastapi import APIRouter

from admin.audit_diff import changed
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, PathTenant, allow
from admin.roles import PLATFORM_WRITE, TENANT_READ
from admin.schemas.limits import LimitsPublic, LimitsUpdate
from admin.serialize import limits_public
from tenancy import store
from tenancy.errors import InvalidValueError, NotFoundError
from tenancy.limits import EffectiveLimits

router = APIRouter(prefix="/tenants/{name}/limits", tags=["limits"], route_class=CappedJsonRoute)


@router.get("", dependencies=[allow(TENANT_READ)])
def get_limits(ctx: Ctx, name: str, tenant: PathTenant, key_id: str | None = None) -> LimitsPublic:
    """The limits in force for a tenant or one of its keys."""
    return limits_public(store.get_limits(ctx.session, tenant_name=name, key_id=key_id))


@router.put("", dependencies=[allow(PLATFORM_WRITE)])
def set_limits(
    ctx: Ctx, name: str, tenant: PathTenant, body: LimitsUpdate, key_id: str | None = None
) -> LimitsPublic:
    """Sets limit fields (absent fields keep their value, null clears one)."""
    try:
        before: LimitsPublic | None = limits_public(
            store.get_limits(ctx.session, tenant_name=name, key_id=key_id)
        )
    except NotFoundError:  # an unknown key: the write below refuses it (404, audited)
        before = None
    changes = body.changes()

    def apply() -> EffectiveLimits:
        unknown = body.unknown()
        if unknown:  # checked before **changes: "session" would collide with a parameter
            raise InvalidValueError(f"unknown limit fields: {', '.join(unknown)}")
        return store.set_limits(ctx.session, tenant_name=name, key_id=key_id, **changes)

    limits = ctx.write(
        "limits.set",
        f"tenants/{name}/limits",
        apply,
        tenant_id=tenant.id,
        detail=lambda after: {
            **({"key_id": key_id} if key_id else {}),
            **(changed(before, limits_public(after)) if before else {}),
        },
    )
    return limits_public(limits)
