"""Fixtures for tenancy tests: a migrated SQLite database and Redis prefixes (principals and
the key pepper: tests/utils/principals.py)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.services import delete_prefix, redis_url


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A migrated SQLite database in the test's temporary folder."""
    url = f"sqlite:///{tmp_path / 'cloister.db'}"
    upgrade_database(url)
    return url


@pytest.fixture
def session_factory(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on `db_url`."""
    engine = make_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def redis_prefix() -> Iterator[tuple[str, str]]:
    """(REDIS_URL, a random key prefix); this test's keys are deleted afterwards."""
    url = redis_url()
    prefix = f"cloister-test:{secrets.token_hex(6)}:"
    yield url, prefix
    client = redis.Redis.from_url(url)
    delete_prefix(client, prefix)
    client.close()
