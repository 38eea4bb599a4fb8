"""Migration 0012 (a model's output cap, a tenant's tokens in flight) keeps data both ways."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_registry_model, insert_tenant


def _round_trip(url: str) -> None:
    upgrade_database(url, "0011")
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as c:
        insert_tenant(c, never_cache=False, created_at=now)
        c.execute(
            sa.text(
                "INSERT INTO limits (tenant_id, max_concurrent, updated_at) VALUES ('ten_1', 3, :n)"
            ),
            {"n": now},
        )
        insert_registry_model(c, created_at=now)
    upgrade_database(url, "0012")
    assert "max_output_tokens" in columns(engine, "registry_models")
    assert "max_tokens_in_flight" in columns(engine, "limits")
    with engine.connect() as c:
        # Existing rows gain no cap.
        assert c.execute(sa.text("SELECT max_output_tokens FROM registry_models")).one() == (None,)
        row = c.execute(sa.text("SELECT max_concurrent, max_tokens_in_flight FROM limits")).one()
        assert tuple(row) == (3, None)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE registry_models SET max_output_tokens = 64"))
        c.execute(sa.text("UPDATE limits SET max_tokens_in_flight = 4096"))
    downgrade_database(url, "0011")
    assert "max_output_tokens" not in columns(engine, "registry_models")
    assert "max_tokens_in_flight" not in columns(engine, "limits")
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT max_concurrent FROM limits")).scalar_one() == 3
        assert c.execute(sa.text("SELECT context_length FROM registry_models")).scalar_one() == 512
    engine.dispose()
    upgrade_database(url)


def test_0012_round_trip(database_url: str) -> None:
    _round_trip(database_url)
