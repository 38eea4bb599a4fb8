"""The billing statement of a period: what finance invoices, and what it must not.

    period       one record: the period, its [start, end) in UTC, the currency
    line         tenant x model x adapter x status x batch x unit prices, in one of three
                 sections:
                   billable    status < 400 with a price in force: total = tokens x prices
                   unpriced    status < 400 with no price in force: total 0, listed apart
                   not_billed  status >= 400 (refused or failed): never billed, total 0
    tenant_total one per tenant with billable lines: what that tenant is invoiced
    total        one per section; the billable one is the grand total

`batch` lines are the Batch API's, apart from the interactive lines (batch False) of the
same model: billed at the unit prices less `batch_discount_pct` percent, each request's
cost rounded down to the pico-USD, so their total may be under tokens x prices x
(100 - discount) / 100 by less than a pico-USD per request.

CSV and JSON lines carry the same records with the same fields. Money is a decimal
string: totals in USD with 12 places (pico-USD exactly, so a spreadsheet's sums are
exact), unit prices in USD per million tokens with 6 places (micro-USD exactly).
`input_tokens` are the prompt tokens not served from the prefix cache.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from admin.billing import parse_period, pico_to_usd
from admin.models import UsageHourly, UsageRow
from admin.registry import Prices
from admin.usage_store import PriceBook
from tenancy.errors import InvalidValueError
from tenancy.models import Tenant

Section = Literal["billable", "unpriced", "not_billed"]
SECTIONS: tuple[Section, ...] = ("billable", "unpriced", "not_billed")
CURRENCY = "USD"
FIELDS = (
    "record",  # period | line | tenant_total | total
    "period",
    "period_start",
    "period_end",
    "section",
    "tenant_name",
    "tenant_id",
    "model",
    "adapter",
    "status",
    "batch",
    "currency",
    "input_usd_per_1m",
    "cached_input_usd_per_1m",
    "output_usd_per_1m",
    "batch_discount_pct",
    "requests",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "total_usd",
)
_HOUR = dt.timedelta(hours=1)
_MICRO = Decimal(10) ** 6


@dataclass(frozen=True)
class StatementLine:
    """Summed usage of one tenant, model, adapter, status and kind (batch or interactive)
    at one set of unit prices."""

    section: Section
    tenant_name: str
    tenant_id: str
    model: str
    adapter: str
    status: int
    batch: bool  # the Batch API's lines, at the batch discount of `prices`
    prices: Prices | None  # None outside the billable section
    requests: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    total_pico_usd: int  # as charged when used; 0 outside the billable section


@dataclass(frozen=True)
class Statement:
    """A period's billing lines, in section, tenant, model, adapter, status, batch order."""

    period: str
    start: dt.datetime
    end: dt.datetime
    lines: tuple[StatementLine, ...]

    @property
    def grand_total_pico_usd(self) -> int:
        """What the period's billable lines add up to."""
        return sum(x.total_pico_usd for x in self.lines if x.section == "billable")


Counts = tuple[int, int, int, int, int]  # requests, input, cached input, output, pico-USD


def _counts(requests: int, prompt: int, cached: int, completion: int, pico: int) -> Counts:
    return (requests, prompt - cached, cached, completion, pico)


def _priced_parts(
    session: Session, book: PriceBook, row: UsageHourly
) -> list[tuple[Prices | None, Counts]]:
    """The hour's usage split by the price in force at each request's time.

    An hour with no price change is one part. An hour in which the model's price
    changed is split from its raw usage records; once those are purged (the rollups
    outlive them) the hour is priced as at its start.
    """
    first = book.find(row.model, row.hour, row.adapter)
    whole = _counts(
        row.requests, row.prompt_tokens, row.cached_tokens, row.completion_tokens, row.cost_pico_usd
    )
    last = row.hour + _HOUR - dt.timedelta(microseconds=1)
    if book.find(row.model, last, row.adapter) == first:
        return [(first, whole)]
    u = UsageRow
    raw = session.scalars(
        select(u).where(
            u.occurred_at >= row.hour,
            u.occurred_at < row.hour + _HOUR,
            u.tenant_id == row.tenant_id,
            u.key_id == row.key_id,
            u.model == row.model,
            u.adapter == row.adapter,
            u.status == row.status,
            u.batch == row.batch,
        )
    ).all()
    if len(raw) != row.requests:
        return [(first, whole)]
    parts: dict[Prices | None, list[int]] = {}
    for r in raw:
        acc = parts.setdefault(book.find(r.model, r.occurred_at, r.adapter), [0, 0, 0, 0, 0])
        for i, v in enumerate(
            _counts(1, r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.cost_pico_usd)
        ):
            acc[i] += v
    return [(p, (a[0], a[1], a[2], a[3], a[4])) for p, a in parts.items()]


def build_statement(session: Session, *, period: str, tenant_id: str | None = None) -> Statement:
    """The statement of `period` (YYYY-MM or YYYY-MM-DD, UTC), of one tenant or all."""
    start, end = parse_period(period)
    query = select(UsageHourly).where(UsageHourly.hour >= start, UsageHourly.hour < end)
    if tenant_id is not None:
        query = query.where(UsageHourly.tenant_id == tenant_id)
    rows = list(session.scalars(query))
    book = PriceBook(session, {r.model for r in rows})
    ids = sorted({r.tenant_id for r in rows})
    names = dict(session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids))).all())
    sums: dict[tuple[Section, str, str, str, int, bool, Prices | None], list[int]] = {}
    for row in rows:
        for prices, counts in _priced_parts(session, book, row):
            section: Section = (
                "not_billed" if row.status >= 400 else "unpriced" if prices is None else "billable"
            )
            kept = prices if section == "billable" else None  # unit prices of billed lines
            key = (
                section,
                row.tenant_id,
                row.model,
                row.adapter,
                int(row.status),
                bool(row.batch),
                kept,
            )
            acc = sums.setdefault(key, [0, 0, 0, 0, 0])
            for i, v in enumerate(counts):
                acc[i] += v
    lines = [
        StatementLine(
            section=sec,
            tenant_name=str(names.get(tid, "")),
            tenant_id=tid,
            model=model,
            adapter=adapter,
            status=status,
            batch=batch,
            prices=prices,
            requests=a[0],
            input_tokens=a[1],
            cached_input_tokens=a[2],
            output_tokens=a[3],
            total_pico_usd=a[4] if sec == "billable" else 0,
        )
        for (sec, tid, model, adapter, status, batch, prices), a in sums.items()
    ]
    lines.sort(
        key=lambda x: (
            SECTIONS.index(x.section),
            x.tenant_name,
            x.tenant_id,
            x.model,
            x.adapter,
            x.status,
            x.batch,
            (
                (
                    x.prices.input,
                    x.prices.cached_input,
                    x.prices.output,
                    x.prices.batch_discount_pct,
                )
                if x.prices
                else ()
            ),
        )
    )
    return Statement(period=period, start=start, end=end, lines=tuple(lines))


def _per_1m(micros: int) -> str:
    return f"{Decimal(micros) / _MICRO:.6f}"


def _summed(record: str, section: Section, lines: Iterable[StatementLine]) -> dict[str, Any]:
    chosen = list(lines)
    return {
        "record": record,
        "section": section,
        "currency": CURRENCY,
        "requests": sum(x.requests for x in chosen),
        "input_tokens": sum(x.input_tokens for x in chosen),
        "cached_input_tokens": sum(x.cached_input_tokens for x in chosen),
        "output_tokens": sum(x.output_tokens for x in chosen),
        "total_usd": pico_to_usd(sum(x.total_pico_usd for x in chosen)),
    }


def statement_records(statement: Statement) -> list[dict[str, Any]]:
    """The statement as flat records with every field of FIELDS (None where not applicable)."""
    s = statement
    head = {
        "period": s.period,
        "period_start": s.start.isoformat(),
        "period_end": s.end.isoformat(),
    }
    out: list[dict[str, Any]] = [{"record": "period", **head, "currency": CURRENCY}]
    for x in s.lines:
        out.append(
            {
                "record": "line",
                "section": x.section,
                "tenant_name": x.tenant_name,
                "tenant_id": x.tenant_id,
                "model": x.model,
                "adapter": x.adapter,
                "status": x.status,
                "batch": x.batch,
                "currency": CURRENCY,
                "input_usd_per_1m": _per_1m(x.prices.input) if x.prices else None,
                "cached_input_usd_per_1m": _per_1m(x.prices.cached_input) if x.prices else None,
                "output_usd_per_1m": _per_1m(x.prices.output) if x.prices else None,
                # Only where it was taken off: a billable batch line.
                "batch_discount_pct": (
                    x.prices.batch_discount_pct if x.prices and x.batch else None
                ),
                "requests": x.requests,
                "input_tokens": x.input_tokens,
                "cached_input_tokens": x.cached_input_tokens,
                "output_tokens": x.output_tokens,
                "total_usd": pico_to_usd(x.total_pico_usd),
            }
        )
    billable = [x for x in s.lines if x.section == "billable"]
    for tid in sorted({x.tenant_id for x in billable}, key=lambda t: (_name(billable, t), t)):
        mine = [x for x in billable if x.tenant_id == tid]
        out.append(
            {
                **_summed("tenant_total", "billable", mine),
                "tenant_name": mine[0].tenant_name,
                "tenant_id": tid,
            }
        )
    for section in SECTIONS:
        out.append(_summed("total", section, (x for x in s.lines if x.section == section)))
    return [{k: {**head, **r}.get(k) for k in FIELDS} for r in out]


def _name(lines: list[StatementLine], tenant_id: str) -> str:
    return next(x.tenant_name for x in lines if x.tenant_id == tenant_id)


def render_statement(statement: Statement, fmt: str) -> str:
    """The statement as CSV (one header row of FIELDS) or as JSON lines."""
    records = statement_records(statement)
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in records)
    if fmt != "csv":
        raise InvalidValueError("format must be csv or jsonl")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(FIELDS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()
