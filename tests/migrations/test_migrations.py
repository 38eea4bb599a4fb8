"""Migrations go up and down on SQLite and PostgreSQL, keeping data on the way up."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import sqlalchemy as sa

import admin.models  # noqa: F401  (registers the admin tables on the shared metadata)
import gateway.batch_api.tables  # noqa: F401  (and the Batch API's)
from tenancy.db import downgrade_database, make_engine, upgrade_database
from tenancy.models import Base
from tests.utils.migration_rows import insert_tenant
from tests.utils.schema import table_names

TABLES = {"tenants", "api_keys", "limits"}


def _round_trip(url: str) -> None:
    # Revision 0001 creates exactly the tenancy tables; later revisions add their own.
    upgrade_database(url, "0001")
    assert table_names(url) == TABLES
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        insert_tenant(conn, created_at=now)
        conn.execute(
            sa.text("INSERT INTO limits (tenant_id, rpm, updated_at) VALUES ('ten_1', 5, :now)"),
            {"now": now},
        )
    # Upgrading to head (and again, a no-op) keeps the data.
    upgrade_database(url)
    upgrade_database(url)
    assert table_names(url) >= TABLES
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM tenants")).scalar_one() == "acme"
        assert conn.execute(sa.text("SELECT rpm FROM limits")).scalar_one() == 5
        # 0004: an existing tenant keeps the engine defaults and caching on.
        policy = conn.execute(
            sa.text(
                "SELECT cache_floor_blocks, cache_floor_share, retention_ttl_s, scrub_on_free, "
                "never_cache FROM tenants"
            )
        ).one()
        assert tuple(policy) == (None, None, None, None, False)
    # The one-tenant-wide-limits-row rule is enforced by the database.
    with engine.connect() as conn:
        try:
            conn.execute(
                sa.text(
                    "INSERT INTO limits (tenant_id, rpm, updated_at) VALUES ('ten_1', 6, :now)"
                ),
                {"now": now},
            )
            conn.commit()
            raise AssertionError("duplicate tenant-wide limits row accepted")
        except sa.exc.IntegrityError:
            conn.rollback()
    engine.dispose()
    downgrade_database(url, "base")
    assert table_names(url) == set()
    upgrade_database(url)
    assert table_names(url) >= TABLES


def _matches_models(url: str) -> None:
    """The migrated schema has every column the ORM models declare."""
    engine = make_engine(url)
    inspector = sa.inspect(engine)
    for table in Base.metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name
    engine.dispose()


def test_sqlite_up_down_up(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    _round_trip(url)
    _matches_models(url)


def test_postgres_up_down_up(postgres_url: str) -> None:
    _round_trip(postgres_url)
    _matches_models(postgres_url)
    _policy_checks(postgres_url)


def _policy_checks(url: str) -> None:
    """On PostgreSQL the database itself refuses out-of-range cache policies."""
    engine = make_engine(url)
    now = dt.datetime.now(dt.UTC)
    for column, value in (
        ("cache_floor_blocks", -1),
        ("cache_floor_share", 1.5),
        ("retention_ttl_s", 0.0),
        ("kv_quota_blocks", 0),
    ):
        with engine.connect() as conn:
            try:
                conn.execute(
                    sa.text(
                        f"INSERT INTO tenants (id, name, status, isolation_level, weight, "
                        f"created_at, {column}) VALUES ('ten_x', 'x', 'active', 'tenant', 1.0, "
                        ":now, :v)"
                    ),
                    {"now": now, "v": value},
                )
                conn.commit()
                raise AssertionError(f"{column}={value} accepted")
            except sa.exc.IntegrityError:
                conn.rollback()
    engine.dispose()
