"""Migration 0010 adds the empty secret_pins table and takes it away again."""

from __future__ import annotations

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.schema import table_names


def _round_trip(url: str) -> None:
    upgrade_database(url, "0009")
    assert "secret_pins" not in table_names(url)
    upgrade_database(url, "0010")
    assert "secret_pins" in table_names(url)
    engine = make_engine(url)
    with engine.connect() as conn:  # nothing pinned until a process with secrets starts
        assert conn.execute(sa.text("SELECT count(*) FROM secret_pins")).scalar_one() == 0
    engine.dispose()
    downgrade_database(url, "0009")
    assert "secret_pins" not in table_names(url)
    upgrade_database(url)


def test_0010_round_trip(database_url: str) -> None:
    _round_trip(database_url)
