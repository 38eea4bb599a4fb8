"""Migration 0005 (device/dtype of loaded models, unpriced usage) keeps data both ways."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_registry_model


def _round_trip(url: str) -> None:
    upgrade_database(url, "0004")
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as c:
        insert_registry_model(c, context_length=8, created_at=now)
        c.execute(
            sa.text(
                "INSERT INTO usage_hourly (hour, tenant_id, key_id, model, adapter, status,"
                " requests, prompt_tokens, cached_tokens, completion_tokens, cost_pico_usd)"
                " VALUES (:n, 'ten_1', 'k', 'm', '', 200, 3, 30, 0, 9, 0)"
            ),
            {"n": now.replace(minute=0, second=0, microsecond=0)},
        )
    upgrade_database(url, "0005")
    assert {"device", "dtype"} <= columns(engine, "registry_models")
    with engine.connect() as c:
        row = c.execute(sa.text("SELECT device, dtype, status FROM registry_models")).one()
        assert tuple(row) == (None, None, "loaded")
        hourly = c.execute(sa.text("SELECT requests, unpriced_requests FROM usage_hourly")).one()
        assert tuple(hourly) == (3, 0)  # earlier usage is not claimed unpriced
    with engine.begin() as c:
        c.execute(sa.text("UPDATE registry_models SET device = 'cpu', dtype = 'float32'"))
    downgrade_database(url, "0004")
    assert "device" not in columns(engine, "registry_models")
    assert "unpriced" not in columns(engine, "usage_records")
    assert "unpriced_requests" not in columns(engine, "usage_hourly")
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT requests FROM usage_hourly")).scalar_one() == 3
        assert c.execute(sa.text("SELECT name FROM registry_models")).scalar_one() == "m"
    engine.dispose()
    upgrade_database(url)


def test_0005_round_trip(database_url: str) -> None:
    _round_trip(database_url)
