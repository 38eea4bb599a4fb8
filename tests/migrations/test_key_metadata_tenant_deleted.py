"""Migration 0008 (api_keys.metadata, tenants.deleted_at) keeps data both ways."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def _round_trip(url: str) -> None:
    upgrade_database(url, "0007")
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO tenants (id, name, status, isolation_level, weight, created_at)"
                " VALUES ('ten_1', 'acme', 'active', 'tenant', 1.0, :n)"
            ),
            {"n": now},
        )
        c.execute(
            sa.text(
                "INSERT INTO api_keys (id, tenant_id, prefix, secret_hash, name, created_at)"
                " VALUES ('key_1', 'ten_1', 'sk-clo-abcd', 'h1', 'ci', :n)"
            ),
            {"n": now},
        )
    upgrade_database(url, "0008")
    assert "metadata" in _columns(engine, "api_keys")
    assert "deleted_at" in _columns(engine, "tenants")
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT name, metadata FROM api_keys")).one() == ("ci", None)
        assert c.execute(sa.text("SELECT deleted_at FROM tenants")).scalar_one() is None
    with engine.begin() as c:
        c.execute(sa.text("""UPDATE api_keys SET metadata = '{"env": "prod"}'"""))
        c.execute(sa.text("UPDATE tenants SET deleted_at = :n, status = 'suspended'"), {"n": now})
    downgrade_database(url, "0007")
    assert "metadata" not in _columns(engine, "api_keys")
    assert "deleted_at" not in _columns(engine, "tenants")
    with engine.connect() as c:  # nothing else lost, the key still belongs to its tenant
        assert c.execute(sa.text("SELECT tenant_id, name FROM api_keys")).one() == ("ten_1", "ci")
        assert c.execute(sa.text("SELECT status FROM tenants")).scalar_one() == "suspended"
    engine.dispose()
    upgrade_database(url)


def test_sqlite_0008_round_trip(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'm.db'}")


def test_postgres_0008_round_trip(postgres_url: str) -> None:
    _round_trip(postgres_url)
