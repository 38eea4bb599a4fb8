"""Prices per LoRA adapter (issue 15): an adapter's own price bills its usage, an adapter
without one is billed at its base model's, and the admin API sets either."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from admin import registry
from admin.metering import usage_row
from admin.models import UsageRow
from admin.usage_store import write_usage
from gateway.usage import UsageRecord
from tests.utils.admin_env import make_env
from tests.utils.admin_seed import usage_record

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BASE = registry.Prices(input=100, cached_input=50, output=1_000)
OWN = registry.Prices(input=300, cached_input=150, output=3_000)


def _record(request_id: str, adapter: str | None) -> UsageRecord:
    return usage_record(request_id, tenant_id="ten_1", key_id="key_1", adapter=adapter)


def test_adapter_usage_is_billed_at_its_own_price_else_its_base_models(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    admin = env.token("admin")
    with env.sessions() as s:
        registry.register_model(
            s, name="m", source="/x", format="safetensors", context_length=64, prices=BASE, now=T0
        )
        for name in ("priced", "unpriced"):
            registry.register_adapter(s, name=name, base_model="m", rank=4, source_path="/a")
    r = env.client.post(
        "/admin/api/v1/models/m/prices",
        json={
            "input_price": OWN.input,
            "cached_input_price": OWN.cached_input,
            "output_price": OWN.output,
            "effective_from": T0.isoformat(),
            "adapter": "priced",
        },
        headers=admin,
    )
    assert r.status_code == 201, r.text
    # The model's own price and history are untouched by the adapter's.
    assert r.json()["price"]["output_price"] == BASE.output
    with env.sessions() as s:
        assert registry.price_in_force(s, model="m", when=T0, adapter="priced") == OWN
        assert registry.price_in_force(s, model="m", when=T0, adapter="unpriced") == BASE
        assert registry.price_in_force(s, model="m", when=T0) == BASE
    missing = {"input_price": 1, "cached_input_price": 1, "output_price": 1, "adapter": "nope"}
    r = env.client.post("/admin/api/v1/models/m/prices", json=missing, headers=admin)
    assert r.status_code == 404
    when = T0 + dt.timedelta(hours=1)
    rows = [
        usage_row(_record("r-own", "priced"), when),
        usage_row(_record("r-base", "unpriced"), when),
        usage_row(_record("r-model", None), when),
    ]
    with env.sessions() as s:
        assert write_usage(s, rows) == 3
        s.commit()
        cost = {rid: s.get(UsageRow, rid) for rid in ("r-own", "r-base", "r-model")}
    expected_own = OWN.cost_pico_usd(prompt_tokens=10, cached_tokens=0, completion_tokens=2)
    expected_base = BASE.cost_pico_usd(prompt_tokens=10, cached_tokens=0, completion_tokens=2)
    assert {k: (v.adapter, v.cost_pico_usd, v.unpriced) for k, v in cost.items() if v} == {
        "r-own": ("priced", expected_own, False),
        "r-base": ("unpriced", expected_base, False),
        "r-model": ("", expected_base, False),
    }
