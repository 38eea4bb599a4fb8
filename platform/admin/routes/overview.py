"""GET /overview: the console's charts of the last hour (engine counters when sampled)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from admin.deps import Ctx, allow
from admin.overview_stats import StatsSampler, overview
from admin.roles import OVERVIEW_READ
from admin.schemas.overview import Overview

router = APIRouter(tags=["overview"])


def get_sampler(request: Request) -> StatsSampler | None:
    """The engine/gateway counter sampler `mount_console` started on this app, if any."""
    sampler: StatsSampler | None = getattr(request.app.state, "admin_stats_sampler", None)
    return sampler


Sampler = Annotated[StatsSampler | None, Depends(get_sampler)]


@router.get("/overview", dependencies=[allow(OVERVIEW_READ)])
def get_overview(
    ctx: Ctx,
    sampler: Sampler,
    minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 60,
    step_s: Annotated[int, Query(ge=10, le=3600)] = 60,
) -> Overview:
    """Requests/s, tokens/s, cache hit rate, KV usage, rejections, p95 TTFT and ITL."""
    tenant = ctx.identity.tenant_id if ctx.identity.role == "tenant-admin" else None
    # Engine counters are platform-wide: a tenant-admin sees only its own usage series.
    samples = None
    if sampler is not None and tenant is None:
        sampler.sample()
        samples = sampler.samples()
    data = overview(
        ctx.session,
        now=dt.datetime.now(dt.UTC),
        minutes=minutes,
        step_s=step_s,
        samples=samples,
        tenant_id=tenant,
    )
    return Overview.model_validate(data)
