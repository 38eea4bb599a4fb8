"""Usage per hour or day, by tenant, key, model or adapter."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from sqlalchemy import select

from admin import billing
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, allow
from admin.models import UsageRow
from admin.roles import USAGE_READ
from admin.schemas.common import Page
from admin.schemas.usage import UsageBucketPublic, UsagePublic, UsageRecordPublic
from admin.serialize import Limit, Offset, page, usage_record_public

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
    batch: bool | None = None,
) -> UsagePublic:
    """Usage per hour or day, by tenant, key, model or adapter (a tenant-admin: its own);
    batch lines (the Batch API) apart from interactive ones, or only one kind (`batch`)."""
    tenant = ctx.scoped_tenant(tenant_id)
    if start.tzinfo is None or end.tzinfo is None:
        raise HTTPException(400, "start and end need a time zone")
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
        batch=batch,
    )
    return UsagePublic(
        items=[UsageBucketPublic(**dataclasses.asdict(b), unpriced=b.unpriced) for b in buckets]
    )


@router.get("/requests", dependencies=[allow(USAGE_READ)])
def usage_requests(
    ctx: Ctx,
    client_request_id: Annotated[str, Query(min_length=1, max_length=128)],
    tenant_id: str | None = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> Page[UsageRecordPublic]:
    """One tenant's usage records sent with a client's x-request-id, newest first
    (a retried request has several)."""
    tenant = ctx.scoped_tenant(tenant_id)
    if tenant is None:  # client ids are the tenant's own: another may use the same
        raise HTTPException(400, "tenant_id is required: client request ids are per tenant")
    query = (
        select(UsageRow)
        .where(UsageRow.tenant_id == tenant, UsageRow.client_request_id == client_request_id)
        .order_by(UsageRow.occurred_at.desc(), UsageRow.request_id)
    )
    return page(ctx.session, query, limit, offset, usage_record_public)
