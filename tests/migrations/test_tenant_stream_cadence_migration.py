"""Migration 0017 (tenants.stream_cadence) keeps data both ways; an existing tenant
streams as before ("token")."""

from __future__ import annotations

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_tenant


def _columns(engine: sa.Engine) -> set[str]:
    return columns(engine, "tenants")


def _round_trip(url: str) -> None:
    upgrade_database(url, "0016")
    engine = make_engine(url)
    with engine.begin() as c:
        insert_tenant(c, never_cache=True)
    upgrade_database(url, "0017")
    assert "stream_cadence" in _columns(engine)
    with engine.connect() as c:  # an existing tenant: today's behaviour, its policy kept
        row = c.execute(sa.text("SELECT stream_cadence, never_cache FROM tenants")).one()
        assert tuple(row) == ("token", True)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE tenants SET stream_cadence = 'fixed:4'"))
        # A row inserted without the column (an older writer) gets the default too.
        insert_tenant(c, id="ten_2", name="beta")
    with engine.connect() as c:
        rows = c.execute(sa.text("SELECT name, stream_cadence FROM tenants ORDER BY name"))
        assert [tuple(r) for r in rows] == [("acme", "fixed:4"), ("beta", "token")]
    downgrade_database(url, "0016")
    assert "stream_cadence" not in _columns(engine)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM tenants")).scalar_one() == 2
    upgrade_database(url)
    with engine.connect() as c:
        values = c.execute(sa.text("SELECT stream_cadence FROM tenants")).scalars().all()
        assert list(values) == ["token", "token"]
    engine.dispose()


def test_0017_round_trip(database_url: str) -> None:
    _round_trip(database_url)
