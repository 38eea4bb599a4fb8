"""Migration 0015 (a model's fallback under overload) keeps data both ways."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database


def _columns(engine: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("registry_models")}


def _round_trip(url: str) -> None:
    upgrade_database(url, "0014")
    engine = make_engine(url)
    with engine.begin() as c:
        for name in ("big", "small"):
            c.execute(
                sa.text(
                    "INSERT INTO registry_models (id, name, revision, source, format,"
                    " context_length, status, created_at) VALUES (:id, :name, 'main', '/m',"
                    " 'gguf', 512, 'loaded', :n)"
                ),
                {"id": f"mdl_{name}", "name": name, "n": dt.datetime.now(dt.UTC)},
            )
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


def test_sqlite_0015_round_trip(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'm.db'}")


def test_postgres_0015_round_trip(postgres_url: str) -> None:
    _round_trip(postgres_url)
