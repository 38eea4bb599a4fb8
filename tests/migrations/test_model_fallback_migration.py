"""Migration 0015 (a model's fallback under overload) keeps data both ways."""

from __future__ import annotations

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_registry_model


def _columns(engine: sa.Engine) -> set[str]:
    return columns(engine, "registry_models")


def _round_trip(url: str) -> None:
    upgrade_database(url, "0014")
    engine = make_engine(url)
    with engine.begin() as c:
        for name in ("big", "small"):
            insert_registry_model(c, id=f"mdl_{name}", name=name)
    upgrade_database(url, "0015")
    assert "fallback_model" in _columns(engine)
    with engine.connect() as c:
        # A row registered before has no fallback.
        rows = c.execute(sa.text("SELECT fallback_model FROM registry_models")).all()
        assert [tuple(r) for r in rows] == [(None,), (None,)]
    with engine.begin() as c:
        c.execute(sa.text("UPDATE registry_models SET fallback_model = 'small' WHERE name = 'big'"))
    downgrade_database(url, "0014")
    assert "fallback_model" not in _columns(engine)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM registry_models")).scalar_one() == 2
    engine.dispose()
    upgrade_database(url)


def test_0015_round_trip(database_url: str) -> None:
    _round_trip(database_url)
