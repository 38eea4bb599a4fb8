"""Billing exports reconcile exactly with the requests made, with and without a price change."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from admin import billing, registry
from admin.metering import MeteringSink
from admin.models import UsageRow
from gateway.usage import UsageRecord
from tenancy.db import make_engine, make_session_factory, upgrade_database

P1 = registry.Prices(input=150_000, cached_input=75_000, output=600_000)  # $0.15/$0.075/$0.60 per M
P2 = registry.Prices(input=200_000, cached_input=50_000, output=900_000)
START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
MID = dt.datetime(2026, 11, 15, 12, 30, tzinfo=dt.UTC)


def _record(i: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}",
        tenant_id="ten_a" if i % 3 else "ten_b",
        key_id="k",
        model="m",
        prompt_tokens=100 + i,
        cached_tokens=i % 40,
        completion_tokens=7 * i % 53,
        ttft_s=None,
        latency_s=0.2,
        status=200,
        finish_reason="stop",
        client_disconnected=False,
    )


@pytest.mark.parametrize("price_change", [False, True])
def test_export_totals_equal_the_requests(tmp_path: Path, price_change: bool) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        registry.register_model(
            s, name="m", source="/m", format="gguf", context_length=8, prices=P1, now=START
        )
        if price_change:
            registry.set_price(s, model="m", prices=P2, effective_from=MID)
    # 300 requests spread over the month; each stamped with its own time of use.
    times = [START + dt.timedelta(minutes=137 * i) for i in range(300)]
    clock_iter = iter(times)
    sink = MeteringSink(sessions, tmp_path / "spool.jsonl", clock=lambda: next(clock_iter)).start()
    expected = 0
    for i, when in enumerate(times):
        r = _record(i)
        prices = P2 if price_change and when >= MID else P1
        fresh = r.prompt_tokens - r.cached_tokens
        expected += (
            fresh * prices.input
            + r.cached_tokens * prices.cached_input
            + r.completion_tokens * prices.output
        )
        sink.record(r)
    sink.close()
    with sessions() as s:
        raw_total = int(s.scalar(sa.select(sa.func.sum(UsageRow.cost_pico_usd))) or 0)
        lines = billing.billing_lines(s, period="2026-11")
    assert raw_total == expected
    rows = list(csv.DictReader(io.StringIO(billing.render(lines, "csv"))))
    assert sum(int(r["cost_pico_usd"]) for r in rows) == expected
    assert sum(Decimal(r["cost_usd"]) for r in rows) == Decimal(expected) / Decimal(10**12)
    assert sum(int(r["completion_tokens"]) for r in rows) == sum(
        _record(i).completion_tokens for i in range(300)
    )
    jsonl = [json.loads(x) for x in billing.render(lines, "jsonl").splitlines()]
    assert sum(int(r["cost_pico_usd"]) for r in jsonl) == expected
    keys = [(r["tenant_id"], r["model"], r["adapter"], r["day"]) for r in rows]
    assert len(keys) == len(set(keys))  # one line per tenant x model x adapter x day
    if price_change:
        assert expected != sum(
            (r.prompt_tokens - r.cached_tokens) * P1.input
            + r.cached_tokens * P1.cached_input
            + r.completion_tokens * P1.output
            for r in map(_record, range(300))
        )


def test_cost_depends_only_on_token_counts_in_exact_units() -> None:
    a = P1.cost_pico_usd(prompt_tokens=50, cached_tokens=10, completion_tokens=20)
    assert a == 40 * P1.input + 10 * P1.cached_input + 20 * P1.output
    assert billing.pico_to_usd(a) == "0.000018750000"


def _record_of(i: int, model: str, *, tokens: int = 10, status: int = 200) -> UsageRecord:
    return UsageRecord(
        request_id=f"{model}-{i}",
        tenant_id="ten_a",
        key_id="k",
        model=model,
        prompt_tokens=tokens,
        cached_tokens=0,
        completion_tokens=tokens,
        ttft_s=None,
        latency_s=0.1,
        status=status,
        finish_reason="stop",
        client_disconnected=False,
    )


def test_unpriced_usage_is_marked_and_a_price_of_zero_is_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        # "free": deliberately priced at 0; "later": no price until MID; "never": none at all.
        registry.register_model(
            s,
            name="free",
            source="/m",
            format="gguf",
            context_length=8,
            prices=registry.FREE,
            now=START,
        )
        registry.register_model(s, name="later", source="/m", format="gguf", context_length=8)
        registry.set_price(s, model="later", prices=P1, effective_from=MID)
        registry.register_model(s, name="never", source="/m", format="gguf", context_length=8)
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
    clock_iter = iter(when for when, _ in uses)
    sink = MeteringSink(sessions, tmp_path / "spool.jsonl", clock=lambda: next(clock_iter)).start()
    for _, record in uses:
        sink.record(record)
    sink.close()
    with sessions() as s:
        lines = billing.billing_lines(s, period="2026-11")
        raw = {r.request_id: r.unpriced for r in s.scalars(sa.select(UsageRow))}
    assert raw == {
        "free-1": False,
        "later-2": True,
        "later-3": True,
        "later-4": False,
        "never-5": True,
        "never-6": False,
    }
    marks = {
        (r["model"], r["day"], r["status"]): (r["unpriced"], r["unpriced_requests"]) for r in lines
    }
    assert marks == {
        ("free", "2026-11-15", 200): (False, 0),
        ("later", "2026-11-15", 200): (True, 2),
        ("later", "2026-11-16", 200): (False, 0),
        ("never", "2026-11-16", 200): (True, 1),
        ("never", "2026-11-16", 429): (False, 0),
    }
    priced_later = next(r for r in lines if r["model"] == "later" and r["day"] == "2026-11-16")
    assert int(str(priced_later["cost_pico_usd"])) > 0
    rows = list(csv.DictReader(io.StringIO(billing.render(lines, "csv"))))
    assert [r["unpriced"] for r in rows if r["model"] == "never"] == ["True", "False"]
    jsonl = [json.loads(x) for x in billing.render(lines, "jsonl").splitlines()]
    assert [r["unpriced"] for r in jsonl if r["model"] == "later"] == [True, False]
