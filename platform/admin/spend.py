"""Spend and tokens of today and this month from the hourly rollups, and a tenant's budget use.

Days and months are UTC, as billing periods and budget periods are (billing.parse_period,
tenancy.limiter.base.period_bounds), so they are whole rollup hours. Costs are pico-USD.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from admin.models import UsageHourly
from tenancy.limiter.base import period_bounds
from tenancy.limits import EffectiveLimits

WARN_SHARE = 0.8  # a budget this far used is shown as a warning


@dataclass(frozen=True)
class PeriodTotals:
    """Requests, prompt plus completion tokens and cost of one tenant (or all) in a period."""

    requests: int
    tokens: int
    cost_pico_usd: int


@dataclass(frozen=True)
class BudgetUse:
    """A token budget and how much of its current period is used."""

    token_budget: int
    period: str
    period_start: str
    used_tokens: int
    used_share: float
    state: str  # "ok", "warning" (>= WARN_SHARE) or "over" (>= 1)


def period_totals(
    session: Session, *, start: dt.datetime, end: dt.datetime, tenant_id: str | None = None
) -> PeriodTotals:
    """Summed rollups in [start, end), of one tenant or of the platform."""
    h = UsageHourly
    query = select(
        func.coalesce(func.sum(h.requests), 0),
        func.coalesce(func.sum(h.prompt_tokens + h.completion_tokens), 0),
        func.coalesce(func.sum(h.cost_pico_usd), 0),
    ).where(h.hour >= start, h.hour < end)
    if tenant_id is not None:
        query = query.where(h.tenant_id == tenant_id)
    requests, tokens, cost = session.execute(query).one()
    return PeriodTotals(int(requests), int(tokens), int(cost))


def _bounds(period: str, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    start, end = period_bounds("day" if period == "day" else "month", now.timestamp())
    return dt.datetime.fromtimestamp(start, dt.UTC), dt.datetime.fromtimestamp(end, dt.UTC)


def today_and_month(
    session: Session, *, now: dt.datetime, tenant_id: str | None = None
) -> tuple[PeriodTotals, PeriodTotals]:
    """The totals of the UTC day and the UTC month containing `now`."""
    totals = []
    for period in ("day", "month"):
        start, end = _bounds(period, now)
        totals.append(period_totals(session, start=start, end=end, tenant_id=tenant_id))
    return totals[0], totals[1]


def budget_use(
    session: Session, *, now: dt.datetime, tenant_id: str, limits: EffectiveLimits
) -> BudgetUse | None:
    """The tenant's token budget use in its current period (None: no budget set).

    Counted as the limiter's ledger counts it (admin.usage_store.UsageLedger): prompt
    plus completion tokens of the whole tenant in the period.
    """
    if limits.token_budget is None:
        return None
    start, end = _bounds(limits.budget_period, now)
    used = period_totals(session, start=start, end=end, tenant_id=tenant_id).tokens
    budget = limits.token_budget
    share = used / budget if budget > 0 else (1.0 if used else 0.0)
    state = "over" if share >= 1 else "warning" if share >= WARN_SHARE else "ok"
    return BudgetUse(budget, limits.budget_period, start.isoformat(), used, share, state)
