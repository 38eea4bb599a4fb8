"""Idempotent usage writes: INSERT ... ON CONFLICT DO NOTHING plus hourly rollups, one transaction.

Only rows that were really inserted (RETURNING) feed the rollups, so a replay of
a row the database already has changes nothing anywhere.

Every statement here is built once with a fixed shape, so SQLAlchemy compiles it
once per engine and a batch pays only for its values; a `.values([...])` statement
has no cache key and was compiled from scratch for every batch. On SQLite the
rows go as a list of parameter sets (executemany; SQLAlchemy's "insertmanyvalues"
keeps RETURNING). On PostgreSQL they go as one JSON parameter through
`json_to_recordset`: the SQL text and its single parameter stay the same whatever
the batch size, so psycopg parses the text once (it re-parses any statement with
more than 50 parameters on every execution) and the server can prepare it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    column,
    delete,
    false,
    func,
    not_,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.dml import Insert

from admin.models import ModelPrice, UsageHourly, UsageRow
from admin.registry import FREE, Prices

ROLLUP_SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_pico_usd")
# Batch lines roll up apart from interactive ones: they are billed at another price.
_ROLLUP_KEY = ("hour", "tenant_id", "key_id", "model", "adapter", "status", "batch")
# Summed per rollup row: the request count, ROLLUP_SUMS and how many were unpriced.
_COUNTED = ("requests", *ROLLUP_SUMS, "unpriced_requests")
_ROLLUP_COLUMNS = (*_ROLLUP_KEY, *_COUNTED)

_USAGE: Table = UsageRow.__table__  # type: ignore[assignment]
_HOURLY: Table = UsageHourly.__table__  # type: ignore[assignment]
_PRICES: Table = ModelPrice.__table__  # type: ignore[assignment]
_USAGE_COLUMNS = tuple(c.name for c in _USAGE.c)

# Core columns rather than ORM entities: the rows are read once into PriceBook, so
# ORM identity and loading work would be pure overhead. `models` expands at run
# time, so one compiled form serves every set of models.
_PRICE_SELECT: Select[Any] = (
    select(
        _PRICES.c.model_name,
        _PRICES.c.adapter,
        _PRICES.c.effective_from,
        _PRICES.c.input_micros_per_m,
        _PRICES.c.cached_input_micros_per_m,
        _PRICES.c.output_micros_per_m,
        _PRICES.c.batch_discount_pct,
    )
    .where(_PRICES.c.model_name.in_(bindparam("models", expanding=True)))
    .order_by(_PRICES.c.effective_from)
)


def _from_json(table: Table, names: Sequence[str]) -> Select[Any]:
    """SELECT the rows of one JSON array parameter `rows` (PostgreSQL).

    One text parameter, however many rows: json.dumps is C and the server parses
    JSON quickly, whereas psycopg dumps arrays (`unnest`) in Python, element by element.
    """
    rows = (
        func.json_to_recordset(cast(bindparam("rows", type_=Text), postgresql.JSON))
        .table_valued(*(column(n, table.c[n].type) for n in names))
        .render_derived(with_types=True)
    )
    return select(*(rows.c[n] for n in names))


def _json_value(value: object) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"no JSON form for {type(value).__name__}")


@dataclass(frozen=True)
class _Statements:
    """The two write statements for one dialect, and how their rows are bound."""

    insert_usage: Insert
    upsert_hourly: Insert
    as_json: bool  # rows go as one JSON parameter rather than as a list of parameter sets

    def params(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | dict[str, str]:
        """`rows` bound the way this dialect's statements expect."""
        if self.as_json:
            return {"rows": json.dumps(rows, default=_json_value)}
        return rows


def _build(dialect: str) -> _Statements:
    as_json = dialect == "postgresql"
    insert = postgresql.insert if as_json else sqlite.insert
    usage = insert(_USAGE)
    hourly = insert(_HOURLY)
    if as_json:
        usage = usage.from_select(_USAGE_COLUMNS, _from_json(_USAGE, _USAGE_COLUMNS))
        hourly = hourly.from_select(_ROLLUP_COLUMNS, _from_json(_HOURLY, _ROLLUP_COLUMNS))
    insert_usage = usage.on_conflict_do_nothing(index_elements=["request_id"]).returning(
        _USAGE.c.request_id
    )
    upsert_hourly = hourly.on_conflict_do_update(
        index_elements=list(_ROLLUP_KEY),
        set_={name: _HOURLY.c[name] + hourly.excluded[name] for name in _COUNTED},
    )
    return _Statements(insert_usage, upsert_hourly, as_json)


_BY_DIALECT: Mapping[str, _Statements] = MappingProxyType(
    {name: _build(name) for name in ("postgresql", "sqlite")}
)


class UnsupportedDatabaseError(RuntimeError):
    """write_usage was given a database other than SQLite or PostgreSQL."""


def hour_of(when: dt.datetime) -> dt.datetime:
    """The UTC hour bucket of `when`."""
    return when.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


class PriceBook:
    """Prices per model (and adapter), loaded once per batch; picks the price in force at
    a time. An adapter without a price of its own in force has its base model's."""

    def __init__(self, session: Session | Connection, models: set[str]) -> None:
        rows = session.execute(_PRICE_SELECT, {"models": sorted(models)}).all()
        self._history: dict[tuple[str, str], list[tuple[dt.datetime, Prices]]] = {}
        for name, adapter, start, fresh, cached, output, discount in rows:
            history = self._history.setdefault((name, adapter or ""), [])
            history.append((start, Prices(fresh, cached, output, discount)))

    def at(self, model: str, when: dt.datetime, adapter: str = "") -> Prices:
        """The latest price effective at or before `when` (FREE if none)."""
        return self.find(model, when, adapter) or FREE

    def find(self, model: str, when: dt.datetime, adapter: str = "") -> Prices | None:
        """The latest price effective at or before `when` (`adapter`'s own, else the
        model's); None if none (unpriced)."""
        if adapter:
            own = self._find((model, adapter), when)
            if own is not None:
                return own
        return self._find((model, ""), when)

    def _find(self, key: tuple[str, str], when: dt.datetime) -> Prices | None:
        found: Prices | None = None
        for start, prices in self._history.get(key, []):
            if start <= when:
                found = prices
            else:
                break
        return found


def _usage_params(
    r: Mapping[str, Any], when: dt.datetime, cost: int, unpriced: bool
) -> dict[str, Any]:
    # Every parameter set must have the same keys (one compiled statement serves all),
    # so optional fields are filled here rather than left to column defaults.
    return {
        "request_id": r["request_id"],
        "occurred_at": when,
        "tenant_id": r["tenant_id"],
        "key_id": r["key_id"],
        "model": r["model"],
        "adapter": r.get("adapter") or "",
        "prompt_tokens": r["prompt_tokens"],
        "cached_tokens": r["cached_tokens"],
        "completion_tokens": r["completion_tokens"],
        "cost_pico_usd": cost,
        "ttft_s": r.get("ttft_s"),
        "latency_s": r["latency_s"],
        "status": r["status"],
        "finish_reason": r.get("finish_reason"),
        "client_disconnected": bool(r.get("client_disconnected", False)),
        "unpriced": unpriced,
        # Absent from rows spooled before migration 0006.
        "client_request_id": r.get("client_request_id"),
        # Absent from rows spooled before migration 0014 (all of them interactive).
        "batch": bool(r.get("batch", False)),
    }


def write_usage(session: Session, rows: Sequence[Mapping[str, Any]]) -> int:
    """Inserts usage rows (spool/JSON form), pricing each at its time; returns how many were new.

    Commits once. Raises the database's error on failure (the caller spools the rows).
    """
    if not rows:
        return 0
    conn = session.connection()
    statements = _BY_DIALECT.get(conn.dialect.name)
    if statements is None:
        raise UnsupportedDatabaseError(
            f"usage writes need SQLite or PostgreSQL, not {conn.dialect.name}"
        )
    book = PriceBook(conn, {r["model"] for r in rows})
    values: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in rows:
        if r["request_id"] in seen:  # a duplicate would feed the rollups twice
            continue
        seen.add(r["request_id"])
        when = dt.datetime.fromisoformat(r["occurred_at"])
        if when.tzinfo is None:  # PostgreSQL would read it in the session's zone
            raise ValueError(f"usage row {r['request_id']!r}: naive occurred_at")
        prices = book.find(r["model"], when, r.get("adapter") or "")
        cost = (prices or FREE).cost_pico_usd(
            prompt_tokens=r["prompt_tokens"],
            cached_tokens=r["cached_tokens"],
            completion_tokens=r["completion_tokens"],
            batch=bool(r.get("batch", False)),
        )
        # Unpriced: tokens used with no price in force. A request that used none (a
        # refusal) costs nothing whatever the price, so it is not marked.
        used = r["prompt_tokens"] + r["completion_tokens"] > 0
        values.append(_usage_params(r, when, cost, prices is None and used))
    result = conn.execute(statements.insert_usage, statements.params(values))
    inserted = set(result.scalars().all())
    buckets: dict[tuple[dt.datetime, str, str, str, str, int, bool], list[int]] = {}
    for v in values:
        if v["request_id"] not in inserted:
            continue
        key = (
            hour_of(v["occurred_at"]),
            v["tenant_id"],
            v["key_id"],
            v["model"],
            v["adapter"],
            int(v["status"]),
            bool(v["batch"]),
        )
        sums = buckets.get(key)
        if sums is None:
            sums = buckets[key] = [0] * len(_COUNTED)
        sums[0] += 1
        for i, name in enumerate(ROLLUP_SUMS, 1):
            sums[i] += int(v[name])
        sums[-1] += int(v["unpriced"])
    if buckets:
        # The buckets are distinct, so no row is touched twice; sorted so that concurrent
        # writers lock rollup rows in the same order (no deadlock on PostgreSQL).
        rollups = [
            {
                **dict(zip(_ROLLUP_KEY, key, strict=True)),
                **dict(zip(_COUNTED, sums, strict=True)),
            }
            for key, sums in sorted(buckets.items())
        ]
        conn.execute(statements.upsert_hourly, statements.params(rollups))
    session.commit()
    return len(inserted)


_HOUR = dt.timedelta(hours=1)


def _price_split_hours(session: Session, before: dt.datetime) -> list[tuple[str, dt.datetime]]:
    """(model, hour) of every hour before `before` in which a price of the model came
    into force after the hour began: the billing statement splits such an hour by each
    request's price, which it reads from the raw rows (billing_export._priced_parts)."""
    hours: set[tuple[str, dt.datetime]] = set()
    for model, start in session.execute(
        select(_PRICES.c.model_name, _PRICES.c.effective_from).where(
            # An hour that begins before `before` may end after it.
            _PRICES.c.effective_from < before + _HOUR
        )
    ):
        hour = hour_of(start)
        # A price in force from the hour's first instant prices the whole hour: no split.
        if start != hour:
            hours.add((model, hour))
    return sorted(hours)


def purge_raw_usage(session: Session, *, older_than: dt.datetime, limit: int) -> int:
    """Deletes raw usage rows from before `older_than`; returns how many.

    What billing reads stays: every raw row was rolled up in the transaction that
    inserted it (write_usage), so the hourly rollups already hold the usage of the rows
    purged; and the rows of an hour in which the model's price changed are kept, since
    the statement prices such an hour request by request. At most `limit` rows go per
    call, so that a large first purge yields to the usage writer between calls rather
    than hold SQLite's write lock (or many PostgreSQL row locks) throughout. Commits.
    """
    kept = [
        and_(
            UsageRow.model == model,
            UsageRow.occurred_at >= hour,
            UsageRow.occurred_at < hour + _HOUR,
        )
        for model, hour in _price_split_hours(session, older_than)
    ]
    purgeable = and_(UsageRow.occurred_at < older_than, not_(or_(false(), *kept)))
    chunk = select(UsageRow.request_id).where(purgeable).limit(limit)
    result = session.execute(delete(UsageRow).where(UsageRow.request_id.in_(chunk)))
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


class UsageLedger:
    """tenancy.limiter.base.BudgetLedger over the hourly rollups (which outlive raw rows).

    Budget periods are UTC days or months, so they are whole rollup hours. A refused
    request's row carries zero tokens, so it spends nothing here either.
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def __call__(self, *, tenant_id: str, key_id: str | None, start: int, end: int) -> int:
        """Prompt plus completion tokens of the tenant (or one key) in [start, end)."""
        h = _HOURLY.c
        query = select(func.coalesce(func.sum(h.prompt_tokens + h.completion_tokens), 0)).where(
            h.tenant_id == tenant_id,
            h.hour >= dt.datetime.fromtimestamp(start, dt.UTC),
            h.hour < dt.datetime.fromtimestamp(end, dt.UTC),
        )
        if key_id is not None:
            query = query.where(h.key_id == key_id)
        with self._sessions() as session:
            return int(session.execute(query).scalar_one())
