"""Idempotent usage writes: INSERT ... ON CONFLICT DO NOTHING plus hourly rollups, one transaction.

Only rows that were really inserted (RETURNING) feed the rollups, so a replay of
a row the database already has changes nothing anywhere.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from admin.models import ModelPrice, UsageHourly, UsageRow
from admin.registry import FREE, Prices

ROLLUP_SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_pico_usd")


def _insert(session: Session, table: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def hour_of(when: dt.datetime) -> dt.datetime:
    """The UTC hour bucket of `when`."""
    return when.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


class PriceBook:
    """Prices per model, loaded once per batch; picks the price in force at a time."""

    def __init__(self, session: Session, models: set[str]) -> None:
        rows = session.scalars(
            select(ModelPrice)
            .where(ModelPrice.model_name.in_(models))
            .order_by(ModelPrice.effective_from)
        ).all()
        self._history: dict[str, list[tuple[dt.datetime, Prices]]] = {}
        for r in rows:
            prices = Prices(
                r.input_micros_per_m, r.cached_input_micros_per_m, r.output_micros_per_m
            )
            self._history.setdefault(r.model_name, []).append((r.effective_from, prices))

    def at(self, model: str, when: dt.datetime) -> Prices:
        """The latest price effective at or before `when` (FREE if none)."""
        found = FREE
        for start, prices in self._history.get(model, []):
            if start <= when:
                found = prices
            else:
                break
        return found


def write_usage(session: Session, rows: Sequence[dict[str, Any]]) -> int:
    """Inserts usage rows (spool/JSON form), pricing each at its time; returns how many were new.

    Commits once. Raises the database's error on failure (the caller spools the rows).
    """
    if not rows:
        return 0
    book = PriceBook(session, {r["model"] for r in rows})
    values: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in rows:
        if r["request_id"] in seen:  # one statement may not conflict with itself on PostgreSQL
            continue
        seen.add(r["request_id"])
        when = dt.datetime.fromisoformat(r["occurred_at"])
        cost = book.at(r["model"], when).cost_pico_usd(
            prompt_tokens=r["prompt_tokens"],
            cached_tokens=r["cached_tokens"],
            completion_tokens=r["completion_tokens"],
        )
        values.append(
            {**r, "occurred_at": when, "adapter": r.get("adapter") or "", "cost_pico_usd": cost}
        )
    stmt = (
        _insert(session, UsageRow)
        .values(values)
        .on_conflict_do_nothing(index_elements=["request_id"])
        .returning(UsageRow.request_id)
    )
    inserted = set(session.scalars(stmt).all())
    buckets: dict[tuple[Any, ...], dict[str, int]] = {}
    for v in values:
        if v["request_id"] not in inserted:
            continue
        key = (hour_of(v["occurred_at"]), v["tenant_id"], v["key_id"], v["model"], v["adapter"])
        sums = buckets.setdefault(key, {"requests": 0, **dict.fromkeys(ROLLUP_SUMS, 0)})
        sums["requests"] += 1
        for name in ROLLUP_SUMS:
            sums[name] += int(v[name])
    if buckets:
        # One multi-row upsert; the buckets are distinct, so no row is touched twice.
        table = UsageHourly.__table__
        rollups = [
            {
                "hour": k[0],
                "tenant_id": k[1],
                "key_id": k[2],
                "model": k[3],
                "adapter": k[4],
                **sums,
            }
            for k, sums in sorted(buckets.items(), key=lambda kv: str(kv[0]))
        ]
        ins = _insert(session, UsageHourly).values(rollups)
        ins = ins.on_conflict_do_update(
            index_elements=["hour", "tenant_id", "key_id", "model", "adapter"],
            set_={name: table.c[name] + ins.excluded[name] for name in ("requests", *ROLLUP_SUMS)},
        )
        session.execute(ins)
    session.commit()
    return len(inserted)


def purge_raw_usage(session: Session, *, older_than: dt.datetime) -> int:
    """Deletes raw usage rows before `older_than` (rollups stay); returns how many."""
    result = session.execute(delete(UsageRow).where(UsageRow.occurred_at < older_than))
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
