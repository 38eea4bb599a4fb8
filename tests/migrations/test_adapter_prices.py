"""Migration 0009 (model_prices.adapter) keeps prices both ways and lets an adapter's
price start when its base model's does."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database

INSERT = (
    "INSERT INTO model_prices (model_name, effective_from, input_micros_per_m,"
    " cached_input_micros_per_m, output_micros_per_m{extra}) VALUES ('m', :n, 1, 2, 3{value})"
)


def _round_trip(url: str) -> None:
    upgrade_database(url, "0008")
    engine = make_engine(url)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with engine.begin() as c:
        c.execute(sa.text(INSERT.format(extra="", value="")), {"n": now})
    upgrade_database(url, "0009")
    with engine.begin() as c:
        assert c.execute(
            sa.text("SELECT adapter, output_micros_per_m FROM model_prices")
        ).one() == (
            "",
            3,
        )
        # The same start as the base model's price: allowed for one of its adapters.
        c.execute(sa.text(INSERT.format(extra=", adapter", value=", 'a1'")), {"n": now})
    downgrade_database(url, "0008")
    with engine.connect() as c:  # the adapter's price is gone, the model's kept
        rows = c.execute(sa.text("SELECT model_name, output_micros_per_m FROM model_prices"))
        assert rows.all() == [("m", 3)]
    engine.dispose()
    upgrade_database(url)


def test_0009_round_trip(database_url: str) -> None:
    _round_trip(database_url)
