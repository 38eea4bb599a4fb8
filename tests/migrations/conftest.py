"""Fixtures for migration tests: a fresh database per test (PostgreSQL, or each kind)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils.services import postgres_database


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A uniquely named, empty PostgreSQL database (DATABASE_URL's server)."""
    with postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind in turn: a SQLite file, then a PostgreSQL database
    (the round trips every migration must make on both)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    with postgres_database() as url:
        yield url
