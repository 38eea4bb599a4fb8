"""The billing export: a period's billing lines as CSV or JSON lines."""

from __future__ import annotations

from typing import Literal, cast

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse

from admin.billing_export import build_statement, render_statement
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, allow
from admin.roles import BILLING_READ

router = APIRouter(prefix="/billing", tags=["billing"], route_class=CappedJsonRoute)
MEDIA = {"csv": "text/csv", "jsonl": "application/x-ndjson"}


@router.get(
    "/export",
    dependencies=[allow(BILLING_READ)],
    response_class=PlainTextResponse,
    responses={200: {"content": {m: {} for m in MEDIA.values()}}},
)
def billing_export(
    ctx: Ctx, period: str, format: str = "csv", tenant_id: str | None = None
) -> PlainTextResponse:
    """A period's statement (YYYY-MM or YYYY-MM-DD) as CSV or JSON lines: a period row,
    billable, unpriced and not-billed lines (batch lines apart, at their batch discount),
    per-tenant and grand totals."""
    tenant = ctx.scoped_tenant(tenant_id)
    if format not in MEDIA:
        raise HTTPException(400, "format must be csv or jsonl")
    try:
        statement = build_statement(ctx.session, period=period, tenant_id=tenant)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc
    ctx.audit("billing.export", f"billing/{period}", tenant_id=tenant, detail={"format": format})
    rendered = render_statement(statement, cast(Literal["csv", "jsonl"], format))
    return PlainTextResponse(rendered, media_type=MEDIA[format])
