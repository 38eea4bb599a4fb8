"""Migration 0014 (batch usage and the batch discount) keeps usage and prices both ways:
existing usage is interactive, existing prices get the default discount, batch rollups
sit beside interactive ones, and a downgrade folds them back together."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns

HOUR = dt.datetime(2026, 11, 3, 10, tzinfo=dt.UTC)
PRICE = (
    "INSERT INTO model_prices (model_name, adapter, effective_from, input_micros_per_m,"
    " cached_input_micros_per_m, output_micros_per_m{cols}) VALUES ('m', '', :n, 1, 2, 3{vals})"
)
RECORD = (
    "INSERT INTO usage_records (request_id, occurred_at, tenant_id, key_id, model, adapter,"
    " prompt_tokens, cached_tokens, completion_tokens, cost_pico_usd, latency_s, status,"
    " client_disconnected, unpriced{cols}) VALUES (:id, :n, 't', 'k', 'm', '', 3, 0, 2, 10,"
    " 0.1, 200, false, false{vals})"
)
HOURLY = (
    "INSERT INTO usage_hourly (hour, tenant_id, key_id, model, adapter, status{cols}, requests,"
    " prompt_tokens, cached_tokens, completion_tokens, cost_pico_usd, unpriced_requests)"
    " VALUES (:h, 't', 'k', 'm', '', 200{vals}, :r, 3, 0, 2, :c, 0)"
)
SUMS = "SELECT requests, cost_pico_usd FROM usage_hourly"


def _round_trip(url: str) -> None:
    upgrade_database(url, "0013")
    engine = make_engine(url)
    with engine.begin() as c:
        c.execute(sa.text(PRICE.format(cols="", vals="")), {"n": HOUR})
        c.execute(sa.text(RECORD.format(cols="", vals="")), {"id": "old", "n": HOUR})
        c.execute(sa.text(HOURLY.format(cols="", vals="")), {"h": HOUR, "r": 1, "c": 10})
    upgrade_database(url, "0014")
    pk = sa.inspect(engine).get_pk_constraint("usage_hourly")
    assert pk["constrained_columns"][-1] == "batch" and len(pk["constrained_columns"]) == 7
    with engine.begin() as c:
        assert c.execute(sa.text("SELECT batch_discount_pct FROM model_prices")).scalar() == 50
        assert c.execute(sa.text("SELECT batch FROM usage_records")).scalar() in (False, 0)
        assert c.execute(sa.text(f"{SUMS} WHERE batch = false")).one() == (1, 10)
        # The same hour, tenant, key, model, adapter and status, as batch: a row of its own.
        c.execute(sa.text(RECORD.format(cols=", batch", vals=", true")), {"id": "new", "n": HOUR})
        c.execute(
            sa.text(HOURLY.format(cols=", batch", vals=", true")), {"h": HOUR, "r": 2, "c": 7}
        )
        assert c.execute(sa.text("SELECT count(*) FROM usage_hourly")).scalar_one() == 2
        c.execute(
            sa.text(PRICE.format(cols=", batch_discount_pct", vals=", 100")),
            {"n": HOUR + dt.timedelta(hours=1)},
        )
    # The database refuses a discount out of 0..100 (on both databases).
    with engine.connect() as c:
        try:
            c.execute(
                sa.text(PRICE.format(cols=", batch_discount_pct", vals=", 101")),
                {"n": HOUR + dt.timedelta(hours=2)},
            )
            c.commit()
            raise AssertionError("a batch discount of 101% was accepted")
        except sa.exc.IntegrityError:
            c.rollback()
    downgrade_database(url, "0013")
    assert "batch" not in columns(engine, "usage_records")
    assert "batch" not in columns(engine, "usage_hourly")
    assert "batch_discount_pct" not in columns(engine, "model_prices")
    with engine.connect() as c:
        # Batch usage folds into the interactive row and keeps its stored cost.
        assert c.execute(sa.text(SUMS)).one() == (3, 17)
        assert c.execute(sa.text("SELECT count(*) FROM usage_records")).scalar_one() == 2
        assert c.execute(sa.text("SELECT count(*) FROM model_prices")).scalar_one() == 2
    engine.dispose()
    upgrade_database(url)


def test_0014_round_trip(database_url: str) -> None:
    _round_trip(database_url)
