"""`LastUsedWriter`: `last_used_at` in the background; a locked database delays it, nothing else.

Issue 13 §7: authentication wrote `last_used_at` itself, so a write lock held
longer than SQLite's busy timeout (5 s) failed the request.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tenancy import store
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.key_usage import LastUsedWriter
from tenancy.models import ApiKey
from tests.utils.principals import PEPPER


def _last_used(sessions: sessionmaker[Session], key_id: str) -> object:
    with sessions() as s:
        row = s.get(ApiKey, key_id)
        assert row is not None
        return row.last_used_at


def test_authentication_reads_through_a_held_write_lock(
    session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with session_factory() as s:
        store.create_tenant(s, name="acme")
        created = store.create_key(s, tenant_name="acme", pepper=PEPPER)
    writer = LastUsedWriter(session_factory)
    auth = Authenticator(session_factory, PEPPER, refresh_s=0.0, last_used=writer)
    lock = sqlite3.connect(tmp_path / "cloister.db", timeout=30, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        assert auth.authenticate(created.secret).key_id == created.id
        assert time.monotonic() - started < 4.0  # no wait for the lock (busy timeout is 5 s)
        assert writer.flush() is False  # the write waits for the lock, off the request path
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert _last_used(session_factory, created.id) is None
    assert writer.flush() is True  # the note was kept and is written now
    assert _last_used(session_factory, created.id) is not None


@pytest.mark.services
def test_batched_write_on_postgres() -> None:
    from tests.utils.services import postgres_database

    with postgres_database() as url:
        upgrade_database(url)
        engine = make_engine(url)
        try:
            sessions = make_session_factory(engine)
            with sessions() as s:
                store.create_tenant(s, name="acme")
                ids = [store.create_key(s, tenant_name="acme", pepper=PEPPER).id for _ in range(3)]
            writer = LastUsedWriter(sessions)
            for key_id in ids:
                writer.touch(key_id)
            assert writer.flush() is True
            assert all(_last_used(sessions, k) is not None for k in ids)
        finally:
            engine.dispose()
