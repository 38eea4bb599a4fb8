"""Migration 0002 goes up and down on SQLite and PostgreSQL, keeping data on the way up."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import insert_tenant
from tests.utils.schema import table_names
from tests.utils.services import postgres_database

ADMIN_TABLES = {
    "registry_models",
    "model_prices",
    "lora_adapters",
    "shared_prefixes",
    "admin_tokens",
    "usage_records",
    "usage_hourly",
    "audit_events",
    "audit_checkpoints",
}


def _round_trip(url: str) -> None:
    upgrade_database(url, "0001")
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as c:
        insert_tenant(c, created_at=now)
    upgrade_database(url)
    assert table_names(url) >= ADMIN_TABLES
    with engine.begin() as c:
        assert c.execute(sa.text("SELECT name FROM tenants")).scalar_one() == "acme"
        c.execute(
            sa.text(
                "INSERT INTO usage_records (request_id, occurred_at, tenant_id, key_id, model, adapter, prompt_tokens, cached_tokens, completion_tokens, cost_pico_usd, latency_s, status, client_disconnected) "
                "VALUES ('r1', :n, 'ten_1', 'k', 'm', '', 1, 0, 2, 3, 0.1, 200, false)"
            ),
            {"n": now},
        )
    upgrade_database(url)  # no-op that keeps data
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT completion_tokens FROM usage_records")).scalar_one() == 2
    engine.dispose()
    downgrade_database(url, "0001")
    assert not (ADMIN_TABLES & table_names(url))
    assert "tenants" in table_names(url)
    downgrade_database(url, "base")
    assert table_names(url) == set()
    upgrade_database(url)
    assert table_names(url) >= ADMIN_TABLES


def test_sqlite_round_trip(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'm.db'}")


@pytest.mark.services
def test_postgres_round_trip() -> None:
    with postgres_database() as url:
        _round_trip(url)
