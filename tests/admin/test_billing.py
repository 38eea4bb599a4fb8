"""Billing statements reconcile exactly with the requests made, with and without a price change."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from admin import billing, registry
from admin.billing_export import build_statement, render_statement
from admin.metering import MeteringSink
from admin.models import UsageRow
from gateway.usage import UsageRecord
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_db import migrated_sessions
from tests.utils.admin_seed import usage_record

P1 = registry.Prices(input=150_000, cached_input=75_000, output=600_000)  # $0.15/$0.075/$0.60 per M
P2 = registry.Prices(input=200_000, cached_input=50_000, output=900_000)
START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
MID = dt.datetime(2026, 11, 15, 12, 30, tzinfo=dt.UTC)


def _record(i: int) -> UsageRecord:
    tokens = {"prompt_tokens": 100 + i, "cached_tokens": i % 40, "completion_tokens": 7 * i % 53}
    return usage_record(f"r{i}", tenant_id="ten_a" if i % 3 else "ten_b", ttft_s=None, **tokens)


def _meter(
    sessions: sessionmaker[Session], tmp_path: Path, uses: list[tuple[dt.datetime, UsageRecord]]
) -> None:
    """Records each (time of use, record) through a MeteringSink whose clock reads that
    time, and closes the sink (everything committed)."""
    clock = iter([when for when, _ in uses])
    sink = MeteringSink(sessions, tmp_path / "spool.jsonl", clock=lambda: next(clock)).start()
    for _, record in uses:
        sink.record(record)
    sink.close()


@pytest.mark.parametrize("price_change", [False, True])
def test_export_totals_equal_the_requests(tmp_path: Path, price_change: bool) -> None:
    sessions = migrated_sessions(tmp_path / "b.db")
    with sessions() as s:
        register_stand_in(s, "m", prices=P1, now=START)
        if price_change:
            registry.set_price(s, model="m", prices=P2, effective_from=MID)
    # 300 requests spread over the month; each stamped with its own time of use.
    uses = [(START + dt.timedelta(minutes=137 * i), _record(i)) for i in range(300)]
    expected = 0
    for when, r in uses:
        prices = P2 if price_change and when >= MID else P1
        fresh = r.prompt_tokens - r.cached_tokens
        expected += (
            fresh * prices.input
            + r.cached_tokens * prices.cached_input
            + r.completion_tokens * prices.output
        )
    _meter(sessions, tmp_path, uses)
    with sessions() as s:
        raw_total = int(s.scalar(sa.select(sa.func.sum(UsageRow.cost_pico_usd))) or 0)
        statement = build_statement(s, period="2026-11")
    assert raw_total == expected == statement.grand_total_pico_usd
    rows = list(csv.DictReader(io.StringIO(render_statement(statement, "csv"))))
    lines = [r for r in rows if r["record"] == "line"]
    assert {r["section"] for r in lines} == {"billable"}
    for r in lines:  # each line's total is its tokens at its unit prices, exactly
        assert Decimal(r["total_usd"]) == (
            int(r["input_tokens"]) * Decimal(r["input_usd_per_1m"])
            + int(r["cached_input_tokens"]) * Decimal(r["cached_input_usd_per_1m"])
            + int(r["output_tokens"]) * Decimal(r["output_usd_per_1m"])
        ) / Decimal(10**6)
    (grand,) = [r for r in rows if r["record"] == "total" and r["section"] == "billable"]
    assert sum(Decimal(r["total_usd"]) for r in lines) == Decimal(grand["total_usd"])
    assert Decimal(grand["total_usd"]) == Decimal(expected) / Decimal(10**12)
    tenant_totals = [r for r in rows if r["record"] == "tenant_total"]
    assert sum(Decimal(r["total_usd"]) for r in tenant_totals) == Decimal(grand["total_usd"])
    assert int(grand["output_tokens"]) == sum(_record(i).completion_tokens for i in range(300))
    jsonl = [json.loads(x) for x in render_statement(statement, "jsonl").splitlines()]
    assert [_as_csv(r) for r in jsonl] == rows  # the same records, the same totals
    assert all(isinstance(r["requests"], int) for r in jsonl if r["record"] != "period")
    prices = {(r["input_usd_per_1m"], r["output_usd_per_1m"]) for r in lines}
    assert prices == (
        {("0.150000", "0.600000"), ("0.200000", "0.900000")}
        if price_change
        else {("0.150000", "0.600000")}
    )
    keys = [
        (r["tenant_id"], r["model"], r["adapter"], r["status"], r["input_usd_per_1m"])
        for r in lines
    ]
    assert len(keys) == len(set(keys))  # one line per tenant x model x adapter x status x price
    if price_change:
        assert expected != sum(
            (r.prompt_tokens - r.cached_tokens) * P1.input
            + r.cached_tokens * P1.cached_input
            + r.completion_tokens * P1.output
            for r in map(_record, range(300))
        )


def _as_csv(record: dict[str, object]) -> dict[str, str]:
    """A JSON-lines record as its CSV row reads (null: empty; numbers: their digits)."""
    return {k: "" if v is None else str(v) for k, v in record.items()}


def test_cost_depends_only_on_token_counts_in_exact_units() -> None:
    a = P1.cost_pico_usd(prompt_tokens=50, cached_tokens=10, completion_tokens=20)
    assert a == 40 * P1.input + 10 * P1.cached_input + 20 * P1.output
    assert billing.pico_to_usd(a) == "0.000018750000"


def _record_of(i: int, model: str, *, tokens: int = 10, status: int = 200) -> UsageRecord:
    counts = {"prompt_tokens": tokens, "completion_tokens": tokens}
    return usage_record(
        f"{model}-{i}", model=model, ttft_s=None, latency_s=0.1, status=status, **counts
    )


def test_unpriced_usage_is_marked_and_a_price_of_zero_is_not(tmp_path: Path) -> None:
    sessions = migrated_sessions(tmp_path / "b.db")
    with sessions() as s:
        # "free": deliberately priced at 0; "later": no price until MID; "never": none at all.
        register_stand_in(s, "free", prices=registry.FREE, now=START)
        register_stand_in(s, "later")
        registry.set_price(s, model="later", prices=P1, effective_from=MID)
        register_stand_in(s, "never")
        assert registry.price_in_force(s, model="never", when=MID) is None
        assert registry.price_at(s, model="never", when=MID) == registry.FREE
        assert registry.price_in_force(s, model="free", when=MID) == registry.FREE
    before, after = MID - dt.timedelta(hours=1), MID + dt.timedelta(days=1)
    uses = [
        (before, _record_of(1, "free")),
        (before, _record_of(2, "later")),
        (before, _record_of(3, "later")),
        (after, _record_of(4, "later")),
        (after, _record_of(5, "never")),
        (after, _record_of(6, "never", tokens=0, status=429)),  # a refusal used nothing
    ]
    _meter(sessions, tmp_path, uses)
    with sessions() as s:
        statement = build_statement(s, period="2026-11")
        raw = {r.request_id: r.unpriced for r in s.scalars(sa.select(UsageRow))}
    assert raw == {
        "free-1": False,
        "later-2": True,
        "later-3": True,
        "later-4": False,
        "never-5": True,
        "never-6": False,
    }
    sections = {
        (x.section, x.model, x.status): (x.requests, x.total_pico_usd) for x in statement.lines
    }
    assert sections == {
        ("billable", "free", 200): (1, 0),  # priced at 0 on purpose: billable, not unpriced
        ("billable", "later", 200): (
            1,
            P1.cost_pico_usd(prompt_tokens=10, cached_tokens=0, completion_tokens=10),
        ),
        ("unpriced", "later", 200): (2, 0),
        ("unpriced", "never", 200): (1, 0),
        ("not_billed", "never", 429): (1, 0),
    }
    rows = list(csv.DictReader(io.StringIO(render_statement(statement, "csv"))))
    unpriced = [r for r in rows if r["record"] == "line" and r["section"] == "unpriced"]
    assert {r["input_usd_per_1m"] for r in unpriced} == {""}  # no price, and none invented
    totals = {r["section"]: r for r in rows if r["record"] == "total"}
    assert (totals["unpriced"]["requests"], totals["unpriced"]["total_usd"]) == (
        "3",
        "0.000000000000",
    )
    assert totals["billable"]["total_usd"] == billing.pico_to_usd(
        sections[("billable", "later", 200)][1]
    )


def test_rejected_requests_are_never_billable_even_with_tokens(tmp_path: Path) -> None:
    sessions = migrated_sessions(tmp_path / "b.db")
    with sessions() as s:
        register_stand_in(s, "m", prices=P1, now=START)
    uses = [_record_of(1, "m"), _record_of(2, "m", status=500), _record_of(3, "m", status=499)]
    _meter(sessions, tmp_path, [(MID, record) for record in uses])
    with sessions() as s:
        statement = build_statement(s, period="2026-11-15")
    one = P1.cost_pico_usd(prompt_tokens=10, cached_tokens=0, completion_tokens=10)
    assert statement.grand_total_pico_usd == one
    refused = [x for x in statement.lines if x.section == "not_billed"]
    assert sorted((x.status, x.output_tokens, x.total_pico_usd) for x in refused) == [
        (499, 10, 0),
        (500, 10, 0),
    ]
    assert all(x.prices is None for x in refused)


def test_an_hour_with_a_price_change_is_split_at_the_change(tmp_path: Path) -> None:
    sessions = migrated_sessions(tmp_path / "b.db")
    with sessions() as s:
        register_stand_in(s, "m", prices=P1, now=START)
        registry.set_price(s, model="m", prices=P2, effective_from=MID)  # 12:30
    early, late = MID - dt.timedelta(minutes=20), MID + dt.timedelta(minutes=20)
    _meter(sessions, tmp_path, [(early, _record_of(1, "m")), (late, _record_of(2, "m", tokens=20))])
    with sessions() as s:
        statement = build_statement(s, period="2026-11")
    assert [(x.prices, x.requests, x.output_tokens) for x in statement.lines] == [
        (P1, 1, 10),
        (P2, 1, 20),
    ]
    assert statement.grand_total_pico_usd == P1.cost_pico_usd(
        prompt_tokens=10, cached_tokens=0, completion_tokens=10
    ) + P2.cost_pico_usd(prompt_tokens=20, cached_tokens=0, completion_tokens=20)
