"""Fixtures for migration tests: a fresh PostgreSQL database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.utils.services import postgres_database


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A uniquely named, empty PostgreSQL database (DATABASE_URL's server)."""
    with postgres_database() as url:
        yield url
