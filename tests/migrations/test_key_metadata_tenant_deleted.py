"""Migration 0008 (api_keys.metadata, tenants.deleted_at) keeps data both ways."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_row, insert_tenant


def _round_trip(url: str) -> None:
    upgrade_database(url, "0007")
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as c:
        insert_tenant(c, created_at=now)
        key = {"id": "key_1", "tenant_id": "ten_1", "prefix": "sk-clo-abcd", "secret_hash": "h1"}
        insert_row(c, "api_keys", {**key, "name": "ci", "created_at": now})
    upgrade_database(url, "0008")
    assert "metadata" in columns(engine, "api_keys")
    assert "deleted_at" in columns(engine, "tenants")
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT name, metadata FROM api_keys")).one() == ("ci", None)
        assert c.execute(sa.text("SELECT deleted_at FROM tenants")).scalar_one() is None
    with engine.begin() as c:
        c.execute(sa.text("""UPDATE api_keys SET metadata = '{"env": "prod"}'"""))
        c.execute(sa.text("UPDATE tenants SET deleted_at = :n, status = 'suspended'"), {"n": now})
    downgrade_database(url, "0007")
    assert "metadata" not in columns(engine, "api_keys")
    assert "deleted_at" not in columns(engine, "tenants")
    with engine.connect() as c:  # nothing else lost, the key still belongs to its tenant
        assert c.execute(sa.text("SELECT tenant_id, name FROM api_keys")).one() == ("ten_1", "ci")
        assert c.execute(sa.text("SELECT status FROM tenants")).scalar_one() == "suspended"
    engine.dispose()
    upgrade_database(url)


def test_0008_round_trip(database_url: str) -> None:
    _round_trip(database_url)
