"""Batch lines (the Batch API, issue 42): metered with their batch flag, billed at the
price's batch discount, and listed apart from interactive usage in the usage API, the
billing statement and its export."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.billing_export import build_statement, render_statement
from admin.metering import MeteringSink, usage_row
from admin.models import ModelPrice, UsageHourly, UsageRow
from admin.usage_store import write_usage
from gateway.usage import UsageRecord
from tenancy import store
from tenancy.errors import InvalidValueError
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_db import migrated_sessions
from tests.utils.admin_env import AdminEnv
from tests.utils.admin_seed import usage_record

P = "/admin/api/v1"
# Odd micro-USD prices, so that a discount which rounded the wrong way would show.
PRICES = registry.Prices(input=150_001, cached_input=75_003, output=600_007)
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
WHEN = dt.datetime(2026, 11, 3, 10, 5, tzinfo=dt.UTC)
TOKENS: dict[str, int] = {"prompt_tokens": 101, "cached_tokens": 33, "completion_tokens": 58}


def _record(
    request_id: str, *, batch: bool, model: str = "m", tenant: str = "ten_a"
) -> UsageRecord:
    return usage_record(
        request_id, tenant_id=tenant, model=model, ttft_s=None, batch=batch, **TOKENS
    )


def _sessions(tmp_path: Path) -> sessionmaker[Session]:
    return migrated_sessions(tmp_path / "b.db")


def _full_cost(prices: registry.Prices) -> int:
    cost: int = prices.cost_pico_usd(**TOKENS)
    return cost


def test_a_batch_line_is_stored_as_batch_and_costs_half_by_default(tmp_path: Path) -> None:
    sessions = _sessions(tmp_path)
    with sessions() as s:
        register_stand_in(s, "m", prices=PRICES, now=T0)
    # Through the gateway's sink, as RequestLifecycle hands its records over.
    sink = MeteringSink(sessions, tmp_path / "spool.jsonl", clock=lambda: WHEN).start()
    sink.record(_record("r-interactive", batch=False))
    sink.record(_record("r-batch", batch=True))
    sink.close()
    with sessions() as s:
        rows = {r.request_id: r for r in s.scalars(sa.select(UsageRow))}
        hourly = {h.batch: (h.requests, h.cost_pico_usd) for h in s.scalars(sa.select(UsageHourly))}
    full = _full_cost(PRICES)
    assert full % 2 == 1  # so "half" below is the rounded-down half
    assert (rows["r-interactive"].batch, rows["r-interactive"].cost_pico_usd) == (False, full)
    assert (rows["r-batch"].batch, rows["r-batch"].cost_pico_usd) == (True, full // 2)
    # One rollup row each: batch usage is never summed into interactive usage.
    assert hourly == {False: (1, full), True: (1, full // 2)}


@pytest.mark.parametrize(
    ("discount", "paid"), [(0, Decimal(1)), (100, Decimal(0)), (25, Decimal("0.75"))]
)
def test_the_discount_of_the_price_in_force_is_taken_off(
    tmp_path: Path, discount: int, paid: Decimal
) -> None:
    sessions = _sessions(tmp_path)
    with sessions() as s:
        register_stand_in(s, "m", prices=PRICES, now=T0)
        priced = registry.Prices(PRICES.input, PRICES.cached_input, PRICES.output, discount)
        registry.set_price(s, model="m", prices=priced, effective_from=WHEN)
        before = usage_row(_record("r-before", batch=True), WHEN - dt.timedelta(minutes=1))
        after = usage_row(_record("r-after", batch=True), WHEN)
        assert write_usage(s, [before, after]) == 2
        cost = {r.request_id: r.cost_pico_usd for r in s.scalars(sa.select(UsageRow))}
    full = _full_cost(PRICES)
    assert cost["r-before"] == full // 2  # the discount in force then (the default)
    assert cost["r-after"] == int(full * paid)  # integer: 0 and 100 are exact, 25 rounds down
    assert cost["r-after"] == priced.cost_pico_usd(**TOKENS, batch=True)


def test_the_registry_and_the_database_refuse_a_discount_out_of_range(tmp_path: Path) -> None:
    sessions = _sessions(tmp_path)
    with sessions() as s:
        register_stand_in(s, "m")
        for bad in (-1, 101):
            with pytest.raises(InvalidValueError, match="batch_discount_pct"):
                registry.set_price(s, model="m", prices=registry.Prices(1, 1, 1, bad))
        s.rollback()
        assert registry.price_history(s, model="m") == []
        # Below the registry, the table's CHECK constraint holds too.
        s.add(
            ModelPrice(
                model_name="m",
                effective_from=T0,
                input_micros_per_m=1,
                cached_input_micros_per_m=1,
                output_micros_per_m=1,
                batch_discount_pct=101,
            )
        )
        with pytest.raises(sa.exc.IntegrityError):
            s.commit()


def _model(env: AdminEnv, headers: dict[str, str], **extra: Any) -> Any:
    body = {"name": "m", "source": str(env.tmp / "models" / "m.gguf"), "format": "gguf"}
    (env.tmp / "models" / "m.gguf").write_bytes(b"GGUF")
    return env.client.post(
        f"{P}/models", json={**body, "context_length": 8, **extra}, headers=headers
    )


def test_the_admin_api_sets_and_shows_the_discount(env: AdminEnv) -> None:
    admin = env.token("admin")
    r = _model(env, admin, input_price=1, cached_input_price=1, output_price=2)
    assert r.status_code == 201, r.text
    assert r.json()["price"]["batch_discount_pct"] == 50  # the default
    prices = {"input_price": 10, "cached_input_price": 5, "output_price": 20}
    for pct in (0, 100, 30):
        r = env.client.post(
            f"{P}/models/m/prices", json={**prices, "batch_discount_pct": pct}, headers=admin
        )
        assert r.status_code == 201, r.text
        assert r.json()["price"]["batch_discount_pct"] == pct
    listed = env.client.get(f"{P}/models", headers=admin).json()["items"]
    assert [m["price"]["batch_discount_pct"] for m in listed] == [30]
    history = env.client.get(f"{P}/models/m", headers=admin).json()["price_history"]
    assert [p["batch_discount_pct"] for p in history] == [50, 0, 100, 30]
    # Omitted: the default, like every other field of a new price.
    r = env.client.post(f"{P}/models/m/prices", json=prices, headers=admin)
    assert r.status_code == 201 and r.json()["price"]["batch_discount_pct"] == 50
    with env.sessions() as s:
        assert registry.price_in_force(
            s, model="m", when=dt.datetime.now(dt.UTC)
        ) == registry.Prices(10, 5, 20, 50)


@pytest.mark.parametrize("bad", [-1, 101, "x", 12.5, True, None])
def test_a_bad_discount_is_a_400_in_the_admin_error_format(env: AdminEnv, bad: object) -> None:
    admin = env.token("admin")
    assert (
        _model(env, admin, input_price=1, cached_input_price=1, output_price=2).status_code == 201
    )
    body = {"input_price": 1, "cached_input_price": 1, "output_price": 1, "batch_discount_pct": bad}
    r = env.client.post(f"{P}/models/m/prices", json=body, headers=admin)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "batch_discount_pct"
    assert error["message"].startswith("batch_discount_pct: ")
    detail = env.client.get(f"{P}/models/m", headers=admin).json()
    assert len(detail["price_history"]) == 1  # nothing was stored


def test_registering_a_model_takes_a_discount_only_with_a_price(env: AdminEnv) -> None:
    admin = env.token("admin")
    r = _model(env, admin, batch_discount_pct=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "batch_discount_pct", r.text
    assert env.client.get(f"{P}/models/m", headers=admin).status_code == 404
    r = _model(env, admin, batch_discount_pct=101, output_price=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "batch_discount_pct"
    r = _model(env, admin, output_price=1, batch_discount_pct=10)
    assert r.status_code == 201, r.text
    price = r.json()["price"]
    assert (price["input_price"], price["output_price"], price["batch_discount_pct"]) == (0, 1, 10)


def _two_kinds(env: AdminEnv) -> tuple[str, int, int]:
    """Tenant alpha's id, and the cost of one interactive and one batch request of "m"
    (discount 40), three interactive and two batch requests written at WHEN."""
    with env.sessions() as s:
        tenant = store.get_tenant(s, "alpha").id
        priced = registry.Prices(PRICES.input, PRICES.cached_input, PRICES.output, 40)
        register_stand_in(s, "m", prices=priced, now=T0)
        rows = [
            usage_row(_record(f"r{i}", batch=i >= 3, tenant=tenant), WHEN + dt.timedelta(minutes=i))
            for i in range(5)
        ]
        assert write_usage(s, rows) == 5
    return tenant, _full_cost(priced), priced.cost_pico_usd(**TOKENS, batch=True)


def test_the_statement_and_its_export_list_batch_lines_apart(env: AdminEnv) -> None:
    tenant, interactive, batch = _two_kinds(env)
    assert batch == interactive * 60 // 100
    with env.sessions() as s:
        statement = build_statement(s, period="2026-11")
    lines = [(x.model, x.batch, x.requests, x.total_pico_usd) for x in statement.lines]
    assert lines == [("m", False, 3, 3 * interactive), ("m", True, 2, 2 * batch)]
    assert statement.grand_total_pico_usd == 3 * interactive + 2 * batch
    admin = env.token("finance")
    exported: dict[str, list[dict[str, Any]]] = {}
    for fmt in ("csv", "jsonl"):
        r = env.client.get(
            f"{P}/billing/export", params={"period": "2026-11", "format": fmt}, headers=admin
        )
        assert r.status_code == 200, r.text
        records = (
            list(csv.DictReader(io.StringIO(r.text)))
            if fmt == "csv"
            else [json.loads(x) for x in r.text.splitlines()]
        )
        exported[fmt] = [x for x in records if x["record"] == "line"]
    csv_lines, json_lines = exported["csv"], exported["jsonl"]
    assert [(x["model"], x["batch"], x["batch_discount_pct"]) for x in json_lines] == [
        ("m", False, None),  # interactive: no discount taken off
        ("m", True, 40),
    ]
    assert [(x["batch"], x["batch_discount_pct"]) for x in csv_lines] == [
        ("False", ""),
        ("True", "40"),
    ]
    # The unit prices are the list prices on both lines; the batch line's total is less.
    assert json_lines[0]["input_usd_per_1m"] == json_lines[1]["input_usd_per_1m"] == "0.150001"
    assert Decimal(json_lines[1]["total_usd"]) == Decimal(2 * batch) / Decimal(10**12)
    # The tenant's total takes in both kinds of line.
    rendered = csv.DictReader(io.StringIO(render_statement(statement, "csv")))
    (sub,) = [x for x in rendered if x["record"] == "tenant_total"]
    assert (sub["tenant_id"], sub["requests"]) == (tenant, "5")
    assert Decimal(sub["total_usd"]) == Decimal(3 * interactive + 2 * batch) / Decimal(10**12)


def test_an_hour_split_by_a_discount_change_keeps_batch_and_interactive_apart(
    tmp_path: Path,
) -> None:
    sessions = _sessions(tmp_path)
    change = WHEN.replace(minute=30)
    with sessions() as s:
        register_stand_in(s, "m", prices=PRICES, now=T0)
        cheaper = registry.Prices(PRICES.input, PRICES.cached_input, PRICES.output, 80)
        registry.set_price(s, model="m", prices=cheaper, effective_from=change)
        uses = [
            ("i1", False, change - dt.timedelta(minutes=10)),
            ("b1", True, change - dt.timedelta(minutes=5)),
            ("b2", True, change + dt.timedelta(minutes=5)),
            ("b3", True, change + dt.timedelta(minutes=6)),
        ]
        rows = [usage_row(_record(rid, batch=b), when) for rid, b, when in uses]
        assert write_usage(s, rows) == 4
        statement = build_statement(s, period="2026-11-03")
    got = [
        (x.batch, x.prices.batch_discount_pct if x.prices else None, x.requests, x.total_pico_usd)
        for x in statement.lines
    ]
    assert got == [
        (False, 50, 1, _full_cost(PRICES)),
        (True, 50, 1, PRICES.cost_pico_usd(**TOKENS, batch=True)),
        (True, 80, 2, 2 * cheaper.cost_pico_usd(**TOKENS, batch=True)),
    ]


def test_the_usage_api_reports_batch_usage_apart(env: AdminEnv) -> None:
    _, interactive, batch = _two_kinds(env)
    admin = env.token("admin")
    window = {"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"}
    items = env.client.get(f"{P}/usage", params=window, headers=admin).json()["items"]
    assert [(b["model"], b["batch"], b["requests"], b["cost_pico_usd"]) for b in items] == [
        ("m", False, 3, 3 * interactive),
        ("m", True, 2, 2 * batch),
    ]
    only = env.client.get(f"{P}/usage", params={**window, "batch": "true"}, headers=admin)
    assert [(b["batch"], b["requests"]) for b in only.json()["items"]] == [(True, 2)]
