"""`create_overview_router`: GET /admin/api/v1/overview, the console's charts of the last hour."""

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from admin.deps import AdminContext, AdminServices, context_dependency
from admin.overview_stats import StatsSampler, overview
from admin.router import PREFIX


def create_overview_router(
    services: AdminServices, sampler: StatsSampler | None = None
) -> APIRouter:
    """The overview route; `sampler` (optional) adds engine and gateway counters."""
    router = APIRouter(prefix=PREFIX, tags=["admin"])
    Ctx = Annotated[AdminContext, Depends(context_dependency(services))]

    @router.get("/overview")
    def get_overview(
        ctx: Ctx,
        minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 60,
        step_s: Annotated[int, Query(ge=10, le=3600)] = 60,
    ) -> dict[str, Any]:
        """Requests/s, tokens/s, cache hit rate, KV usage, rejections, p95 TTFT and ITL."""
        tenant = ctx.identity.tenant_id if ctx.identity.role == "tenant-admin" else None
        # Engine counters are platform-wide: a tenant-admin sees only its own usage series.
        samples = None
        if sampler is not None and tenant is None:
            sampler.sample()
            samples = sampler.samples()
        return overview(
            ctx.session,
            now=dt.datetime.now(dt.UTC),
            minutes=minutes,
            step_s=step_s,
            samples=samples,
            tenant_id=tenant,
        )

    return router
