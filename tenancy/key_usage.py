"""`LastUsedWriter`: keys' `last_used_at`, written in batches by a background thread.

Authentication only notes "key K was used at T" in memory; the thread writes
every noted key in one transaction every `interval_s`. A database that is
locked or down delays the write (the notes are kept and merged), never a request.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from tenancy.models import ApiKey

logger = logging.getLogger("cloister.tenancy")


class LastUsedWriter:
    """Batches `last_used_at` updates; see the module docstring."""

    def __init__(self, sessions: sessionmaker[Session], *, interval_s: float = 5.0) -> None:
        self._sessions = sessions
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._pending: dict[str, dt.datetime] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def touch(self, key_id: str, when: dt.datetime | None = None) -> None:
        """Notes a use of `key_id` (O(1), never touches the database)."""
        at = when or dt.datetime.now(dt.UTC)
        with self._lock:
            before = self._pending.get(key_id)
            if before is None or before < at:
                self._pending[key_id] = at

    def start(self) -> LastUsedWriter:
        """Starts the background thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="cloister-last-used", daemon=True
            )
            self._thread.start()
        return self

    def flush(self) -> bool:
        """Writes every noted use now; False (notes kept) when the database refused."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return True
        table = cast(sa.Table, ApiKey.__table__)
        stmt = (
            sa.update(table)
            .where(table.c.id == sa.bindparam("b_id"))
            .where(
                sa.or_(table.c.last_used_at.is_(None), table.c.last_used_at < sa.bindparam("b_at"))
            )
            .values(last_used_at=sa.bindparam("b_at"))
        )
        try:
            with self._sessions() as session:
                session.connection().execute(
                    stmt, [{"b_id": k, "b_at": at} for k, at in batch.items()]
                )
                session.commit()
        except Exception as exc:  # locked or unreachable database: try again next round
            logger.warning("last_used_at not written yet: %s", type(exc).__name__)
            for key_id, at in batch.items():
                self.touch(key_id, at)
            return False
        return True

    def close(self) -> None:
        """Stops the thread and writes what is left (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.flush()
