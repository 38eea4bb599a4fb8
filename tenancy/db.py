"""The one database session factory, and schema upgrades through Alembic."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

# tenancy/ sits at the repository root next to migrations/.
REPO_ROOT = Path(__file__).resolve().parents[1]
MIGRATIONS_DIR = REPO_ROOT / "migrations"


def normalize_url(url: str) -> str:
    """Route plain PostgreSQL URLs to psycopg 3 (SQLAlchemy's default would be psycopg2)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers (the gateway) run while the CLI writes; FKs are off by default.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


# The database holds key hashes, usage and the audit log: only its owner may read it.
SQLITE_FILE_MODE = 0o600


def make_private_sqlite_file(url: str) -> None:
    """Creates the SQLite file of `url` with mode 0600 (or takes an existing one to 0600).

    SQLite itself would create it with 0644 under the usual umask, and its -wal and -shm
    files copy the database file's mode.
    """
    database = sa.make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.is_dir():
        return  # connecting fails with SQLite's own error
    fd = os.open(path, os.O_RDWR | os.O_CREAT, SQLITE_FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, SQLITE_FILE_MODE)
    finally:
        os.close(fd)


def make_engine(url: str) -> sa.Engine:
    """A SQLAlchemy engine: SQLite with WAL and foreign keys, or PostgreSQL via psycopg 3."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        make_private_sqlite_file(url)
        engine = sa.create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: sa.Engine) -> sessionmaker[Session]:
    """The session factory everyone uses; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def alembic_config(url: str) -> Any:
    """An Alembic Config for `url`, built in code (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # configparser interpolation: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade_database(url: str, revision: str = "head") -> None:
    """Bring the schema at `url` to `revision` (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade_database(url: str, revision: str) -> None:
    """Take the schema at `url` down to `revision` ("base" drops every table)."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)
