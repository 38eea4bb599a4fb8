"""A migrated SQLite database for admin tests, and the audit record they write most."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.services import postgres_database


@contextlib.contextmanager
def migrated_engine(url: str) -> Iterator[tuple[sa.Engine, sessionmaker[Session]]]:
    """Migrates the database at `url` to head; yields its engine and sessions, and
    disposes of the engine afterwards."""
    upgrade_database(url)
    engine = make_engine(url)
    try:
        yield engine, make_session_factory(engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def migrated_postgres() -> Iterator[tuple[sa.Engine, sessionmaker[Session]]]:
    """A fresh PostgreSQL database (tests/utils/services.py; dropped afterwards),
    migrated: `migrated_engine`'s engine and sessions on it."""
    with postgres_database() as url, migrated_engine(url) as pair:
        yield pair


def migrated_sessions(db_file: Path) -> sessionmaker[Session]:
    """Sessions on the SQLite database at `db_file`, created and migrated to head."""
    url = f"sqlite:///{db_file}"
    upgrade_database(url)
    return make_session_factory(make_engine(url))


class _Records(Protocol):
    def record(self, **fields: Any) -> Any: ...


def record_tenant_create(log: _Records, i: int, outcome: str = "success", **fields: Any) -> Any:
    """Records admin adm_1's creation of tenant `t{i}` on an AuditLog or AuditWriter
    (`fields`: more of its record's fields, such as `detail`); returns what it returns."""
    return log.record(
        actor="token:adm_1",
        role="admin",
        action="tenant.create",
        resource=f"tenants/t{i}",
        outcome=outcome,
        **fields,
    )
