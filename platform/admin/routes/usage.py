"""Usage per hour or day, by tenant, key, model or adapter."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Literal

from fastapi import APIRouter, HTTPException

from admin import billing
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, allow
from admin.roles import USAGE_READ
from admin.schemas.usage import UsageBucketPublic, UsagePublic

router = APIRouter(prefix="/usage", tags=["usage"], route_class=CappedJsonRoute)


@router.get("", dependencies=[allow(USAGE_READ)])
def usage(
    ctx: Ctx,
    start: dt.datetime,
    end: dt.datetime,
    granularity: Literal["hour", "day"] = "day",
    tenant_id: str | None = None,
    key_id: str | None = None,
    model: str | None = None,
    adapter: str | None = None,
    by_key: bool = False,
) -> UsagePublic:
    """Usage per hour or day, by tenant, key, model or adapter (a tenant-admin: its own)."""
    tenant = ctx.scoped_tenant(tenant_id)
    if start.tzinfo is None or end.tzinfo is None:
        raise HTTPException(422, "start and end need a time zone")
    buckets = billing.query_usage(
        ctx.session,
        start=start,
        end=end,
        granularity=granularity,
        tenant_id=tenant,
        key_id=key_id,
        model=model,
        adapter=adapter,
        by_key=by_key,
    )
    return UsagePublic(
        items=[UsageBucketPublic(**dataclasses.asdict(b), unpriced=b.unpriced) for b in buckets]
    )
