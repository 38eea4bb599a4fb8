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
