"""The billing export, read as finance reads it, reconciles with the usage API to the pico-dollar."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any

from admin import registry
from admin.billing_export import FIELDS
from admin.usage_store import write_usage
from tenancy import store
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import AdminEnv

P = "/admin/api/v1"
PRICES = registry.Prices(input=150_000, cached_input=75_000, output=600_000)
DAY = dt.datetime(2026, 11, 3, 10, tzinfo=dt.UTC)
INTS = ("status", "requests", "input_tokens", "cached_input_tokens", "output_tokens")
MONEY = ("input_usd_per_1m", "cached_input_usd_per_1m", "output_usd_per_1m", "total_usd")
PICO = Decimal(10) ** 12


def _row(i: int, tenant_id: str, model: str, status: int = 200, tokens: int = 40) -> dict[str, Any]:
    used = tokens if status < 400 or status >= 499 else 0  # refusals carry no tokens
    return {
        "request_id": f"req-{i}",
        "occurred_at": (DAY + dt.timedelta(minutes=7 * i)).isoformat(),
        "tenant_id": tenant_id,
        "key_id": "k1",
        "model": model,
        "adapter": "support-lora" if i % 4 == 0 else "",
        "prompt_tokens": used + i,
        "cached_tokens": (used + i) // 3,
        "completion_tokens": used // 2 + i % 5,
        "latency_s": 0.1,
        "status": status,
    }


def test_billing_export_reconciles_with_the_usage_api(env: AdminEnv) -> None:
    with env.sessions() as s:
        ids = {t.name: t.id for t in store.list_tenants(s)}
        register_stand_in(s, "priced", prices=PRICES, now=DAY)
        register_stand_in(s, "nopri")
        rows = [_row(i, ids["alpha" if i % 3 else "beta"], "priced") for i in range(30)]
        rows += [_row(100 + i, ids["alpha"], "nopri") for i in range(4)]
        rows += [_row(200 + i, ids["beta"], "priced", status=429) for i in range(3)]
        rows += [_row(300, ids["alpha"], "priced", status=500)]  # failed after using tokens
        assert write_usage(s, rows) == len(rows)
    admin = env.token("admin")
    usage = env.client.get(
        f"{P}/usage",
        params={"start": "2026-11-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
        headers=admin,
    ).json()["items"]
    csv_text = env.client.get(
        f"{P}/billing/export", params={"period": "2026-11", "format": "csv"}, headers=admin
    ).text
    jsonl = env.client.get(
        f"{P}/billing/export", params={"period": "2026-11", "format": "jsonl"}, headers=admin
    ).text

    # As a spreadsheet opens it: one header row, then rows whose numbers parse.
    reader = csv.DictReader(io.StringIO(csv_text))
    assert tuple(reader.fieldnames or ()) == FIELDS
    sheet = list(reader)
    (head,) = [r for r in sheet if r["record"] == "period"]
    assert (head["period_start"], head["period_end"]) == (
        "2026-11-01T00:00:00+00:00",
        "2026-12-01T00:00:00+00:00",
    )
    body = [r for r in sheet if r["record"] != "period"]
    for r in body:
        assert r["currency"] == "USD" and r["period"] == "2026-11"
        for k in INTS:
            if r[k] != "":
                int(r[k])
        for k in MONEY:
            if r[k] != "":
                Decimal(r[k])
    lines = [r for r in body if r["record"] == "line"]
    assert {r["tenant_name"] for r in lines} == {"alpha", "beta"}
    assert all(r["tenant_id"] == ids[r["tenant_name"]] for r in lines)

    # Billable: what the usage API reports as charged for accepted requests, exactly.
    charged = sum(b["cost_pico_usd"] for b in usage if b["status"] < 400)
    billable = [r for r in lines if r["section"] == "billable"]
    totals = {r["section"]: r for r in body if r["record"] == "total"}
    assert sum(Decimal(r["total_usd"]) for r in billable) == Decimal(charged) / PICO
    assert Decimal(totals["billable"]["total_usd"]) == Decimal(charged) / PICO
    for name, tid in ids.items():
        (sub,) = [r for r in body if r["record"] == "tenant_total" and r["tenant_id"] == tid]
        mine = sum(b["cost_pico_usd"] for b in usage if b["status"] < 400 and b["tenant_id"] == tid)
        assert Decimal(sub["total_usd"]) == Decimal(mine) / PICO and sub["tenant_name"] == name

    # Every request is on exactly one line; unpriced and rejected ones bill nothing.
    def by_group(items: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[int]]:
        out: dict[tuple[Any, ...], list[int]] = {}
        for x in items:
            g = (x["tenant_id"], x["model"], x["adapter"], int(x["status"]))
            acc = out.setdefault(g, [0] * len(keys))
            for i, k in enumerate(keys):
                acc[i] += int(x[k])
        return out

    api = {
        g: [n, p - c, c, o]
        for g, (n, p, c, o) in by_group(
            usage, "requests", "prompt_tokens", "cached_tokens", "completion_tokens"
        ).items()
    }
    exported = by_group(lines, "requests", "input_tokens", "cached_input_tokens", "output_tokens")
    assert exported == api
    unpriced = [r for r in lines if r["section"] == "unpriced"]
    assert {r["model"] for r in unpriced} == {"nopri"}
    assert int(totals["unpriced"]["requests"]) == 4
    refused = [r for r in lines if r["section"] == "not_billed"]
    assert {int(r["status"]) for r in refused} == {429, 500}
    assert int(totals["not_billed"]["requests"]) == sum(
        b["requests"] for b in usage if b["status"] >= 400
    )
    assert {r["total_usd"] for r in unpriced + refused} == {"0.000000000000"}
    failed = next(r for r in refused if r["status"] == "500")
    assert int(failed["output_tokens"]) > 0  # it used tokens, and is still not billed

    # The JSON lines export: the same records, the same totals.
    records = [json.loads(x) for x in jsonl.splitlines()]
    assert [{k: "" if v is None else str(v) for k, v in r.items()} for r in records] == sheet
