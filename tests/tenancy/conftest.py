"""Fixtures for tenancy tests: a migrated SQLite database, principals, Redis prefixes."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.limits import EffectiveLimits
from tenancy.principal import Principal
from tests.utils.services import delete_prefix, redis_url

PEPPER = "test-pepper"


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


def make_principal(tenant_id: str = "ten_a", key_id: str = "key_a", **limits: object) -> Principal:
    """A principal with the given effective limits (tenant-scoped unless key_scoped says)."""
    return Principal(
        tenant_id=tenant_id,
        tenant_name=tenant_id,
        key_id=key_id,
        isolation_level="tenant",
        weight=1.0,
        limits=EffectiveLimits(**limits),  # type: ignore[arg-type]
        allowed_models=None,
    )


@pytest.fixture
def redis_prefix() -> Iterator[tuple[str, str]]:
    """(REDIS_URL, a random key prefix); this test's keys are deleted afterwards."""
    url = redis_url()
    prefix = f"cloister-test:{secrets.token_hex(6)}:"
    yield url, prefix
    client = redis.Redis.from_url(url)
    delete_prefix(client, prefix)
    client.close()
