"""Usage queries from the hourly rollups, and the period and money helpers of billing.

The billing statement itself is admin/billing_export.py. Money leaves as a decimal
string of USD with 12 places (pico-USD exactly), so a spreadsheet's sums are exact.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from admin.models import UsageHourly
from tenancy.errors import InvalidValueError

Granularity = Literal["hour", "day"]
PICO = Decimal(10) ** 12


def pico_to_usd(pico: int) -> str:
    """pico-USD as an exact decimal string of USD."""
    return f"{Decimal(pico) / PICO:.12f}"


def parse_period(period: str) -> tuple[dt.datetime, dt.datetime]:
    """ "2026-11" (a month) or "2026-11-05" (a day) -> [start, end) in UTC."""
    try:
        if len(period) == 7:
            start = dt.datetime.strptime(period, "%Y-%m").replace(tzinfo=dt.UTC)
            end = (start + dt.timedelta(days=32)).replace(day=1)
        else:
            start = dt.datetime.strptime(period, "%Y-%m-%d").replace(tzinfo=dt.UTC)
            end = start + dt.timedelta(days=1)
    except (ValueError, TypeError) as exc:
        raise InvalidValueError("period must be YYYY-MM or YYYY-MM-DD") from exc
    except OverflowError as exc:  # the period ends after year 9999 (e.g. "9999-12")
        raise InvalidValueError("period must end before the year 10000") from exc
    return start, end


@dataclass(frozen=True)
class UsageBucket:
    """Summed usage of one group in one hour or day."""

    start: str
    tenant_id: str
    key_id: str | None
    model: str
    adapter: str
    status: int  # the HTTP status; refused requests carry zero tokens and cost
    batch: bool  # batch lines (the Batch API), at their batch price, apart from interactive
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_pico_usd: int
    unpriced_requests: int = 0  # requests that used tokens with no price in force ($0)

    @property
    def unpriced(self) -> bool:
        """Whether any of this usage was unpriced (billed $0 for want of a price)."""
        return self.unpriced_requests > 0


def query_usage(
    session: Session,
    *,
    start: dt.datetime,
    end: dt.datetime,
    granularity: Granularity = "day",
    tenant_id: str | None = None,
    key_id: str | None = None,
    model: str | None = None,
    adapter: str | None = None,
    by_key: bool = False,
    batch: bool | None = None,
) -> list[UsageBucket]:
    """Usage in [start, end) per hour or UTC day, per tenant x model x adapter (x key),
    batch lines apart from interactive ones (`batch` True or False: only those)."""
    if granularity not in ("hour", "day"):
        raise InvalidValueError("granularity must be hour or day")
    h = UsageHourly
    query = select(h).where(h.hour >= start, h.hour < end)
    for column, value in (
        (h.tenant_id, tenant_id),
        (h.key_id, key_id),
        (h.model, model),
        (h.adapter, adapter),
        (h.batch, batch),
    ):
        if value is not None:
            query = query.where(column == value)
    sums: dict[tuple[str, str, str | None, str, str, int, bool], list[int]] = {}
    for row in session.scalars(query):
        stamp = row.hour if granularity == "hour" else row.hour.replace(hour=0)
        label = stamp.isoformat() if granularity == "hour" else stamp.date().isoformat()
        group = (
            label,
            row.tenant_id,
            row.key_id if by_key or key_id else None,
            row.model,
            row.adapter,
            int(row.status),
            bool(row.batch),
        )
        acc = sums.setdefault(group, [0, 0, 0, 0, 0, 0])
        for i, v in enumerate(
            (
                row.requests,
                row.prompt_tokens,
                row.cached_tokens,
                row.completion_tokens,
                row.cost_pico_usd,
                row.unpriced_requests,
            )
        ):
            acc[i] += int(v)
    return [
        UsageBucket(*group, *acc) for group, acc in sorted(sums.items(), key=lambda kv: str(kv[0]))
    ]
