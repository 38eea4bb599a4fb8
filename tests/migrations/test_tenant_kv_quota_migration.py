"""Migration 0011 (tenants.kv_quota_blocks) keeps data both ways; PostgreSQL refuses a
quota below 1 by itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_tenant


def _columns(engine: sa.Engine) -> set[str]:
    return columns(engine, "tenants")


def _insert(conn: sa.Connection, tid: str, quota: int | None) -> None:
    insert_tenant(conn, id=tid, name=tid, kv_quota_blocks=quota)


def _round_trip(url: str) -> sa.Engine:
    upgrade_database(url, "0010")
    engine = make_engine(url)
    with engine.begin() as c:
        insert_tenant(c, cache_floor_blocks=8)
    upgrade_database(url, "0011")
    assert "kv_quota_blocks" in _columns(engine)
    with engine.connect() as c:  # an existing tenant: no quota, its policy kept
        row = c.execute(sa.text("SELECT kv_quota_blocks, cache_floor_blocks FROM tenants")).one()
        assert tuple(row) == (None, 8)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE tenants SET kv_quota_blocks = 12"))
    downgrade_database(url, "0010")
    assert "kv_quota_blocks" not in _columns(engine)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT name, cache_floor_blocks FROM tenants")).one() == (
            "acme",
            8,
        )
    upgrade_database(url)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT kv_quota_blocks FROM tenants")).scalar_one() is None
    return engine


def test_sqlite_0011_round_trip(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'm.db'}").dispose()


def test_postgres_0011_round_trip_and_check(postgres_url: str) -> None:
    engine = _round_trip(postgres_url)
    with engine.begin() as c:
        _insert(c, "ten_ok", 1)
    for bad in (0, -1):
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
            _insert(c, f"ten_{-bad}", bad)
    engine.dispose()
