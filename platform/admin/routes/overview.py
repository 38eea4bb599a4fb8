"""GET /overview: the console's charts and summary tiles (engine counters when sampled)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from admin.deps import Ctx, allow
from admin.overview_stats import Sample, StatsSampler, overview
from admin.roles import OVERVIEW_READ
from admin.schemas.overview import EngineLoad, Overview, SpendPeriod, Summary
from admin.spend import PeriodTotals, today_and_month

router = APIRouter(tags=["overview"])
MAX_MINUTES = 7 * 24 * 60  # the console's longest range: 7 days
MAX_POINTS = 2000  # points per series; a longer step is needed for more


def get_sampler(request: Request) -> StatsSampler | None:
    """The engine/gateway counter sampler `mount_console` started on this app, if any."""
    sampler: StatsSampler | None = getattr(request.app.state, "admin_stats_sampler", None)
    return sampler


Sampler = Annotated[StatsSampler | None, Depends(get_sampler)]


def _period(t: PeriodTotals) -> SpendPeriod:
    return SpendPeriod(requests=t.requests, tokens=t.tokens, cost_pico_usd=t.cost_pico_usd)


def _engine_load(samples: Sequence[Sample] | None) -> EngineLoad:
    last = samples[-1] if samples else None
    values = last.values if last else {}

    def count(name: str) -> int | None:
        return int(values[name]) if name in values else None

    return EngineLoad(
        num_waiting=count("num_waiting"),
        num_running=count("num_running"),
        kv_cache_usage=values.get("kv_cache_usage"),
        sampled_at=dt.datetime.fromtimestamp(last.at, dt.UTC).isoformat() if last else None,
    )


@router.get("/overview", dependencies=[allow(OVERVIEW_READ)])
def get_overview(
    ctx: Ctx,
    sampler: Sampler,
    minutes: Annotated[int, Query(ge=1, le=MAX_MINUTES)] = 60,
    step_s: Annotated[int, Query(ge=10, le=3600)] = 60,
) -> Overview:
    """Charts (requests/s, tokens/s, cache hit rate, KV usage, rejections, p95 TTFT and ITL)
    and tiles (the window's totals, today's and the month's spend, queue and KV now)."""
    tenant = ctx.identity.tenant_id if ctx.identity.role == "tenant-admin" else None
    # A 7-day range at a 10 s step would be 60,480 points: widen the step instead.
    step_s = max(step_s, -(-minutes * 60 // MAX_POINTS))
    # Engine counters are platform-wide: a tenant-admin sees only its own usage series.
    samples = None
    if sampler is not None and tenant is None:
        sampler.sample()
        samples = sampler.samples()
    now = dt.datetime.now(dt.UTC)
    data = overview(
        ctx.session, now=now, minutes=minutes, step_s=step_s, samples=samples, tenant_id=tenant
    )
    window = data.pop("window")
    today, month = today_and_month(ctx.session, now=now, tenant_id=tenant)
    summary = Summary.model_validate(
        {
            **(window if isinstance(window, dict) else {}),
            "minutes": minutes,
            "today": _period(today),
            "month": _period(month),
            "engine": None if tenant is not None else _engine_load(samples),
        }
    )
    return Overview.model_validate({**data, "summary": summary})
