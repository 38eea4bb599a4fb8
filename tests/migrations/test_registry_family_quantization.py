"""Migration 0013 (a loaded model's family and storage type) keeps data both ways."""

from __future__ import annotations

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns, insert_registry_model


def _columns(engine: sa.Engine) -> set[str]:
    return columns(engine, "registry_models")


def _round_trip(url: str) -> None:
    upgrade_database(url, "0012")
    engine = make_engine(url)
    with engine.begin() as c:
        insert_registry_model(c)
    upgrade_database(url, "0013")
    assert {"family", "quantization"} <= _columns(engine)
    with engine.connect() as c:
        # A row registered before names neither.
        assert tuple(
            c.execute(sa.text("SELECT family, quantization FROM registry_models")).one()
        ) == (None, None)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE registry_models SET family = 'qwen3', quantization = 'Q4_K'"))
    downgrade_database(url, "0012")
    assert not {"family", "quantization"} & _columns(engine)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT context_length FROM registry_models")).scalar_one() == 512
    engine.dispose()
    upgrade_database(url)


def test_0013_round_trip(database_url: str) -> None:
    _round_trip(database_url)
