"""`UsageRetention`: raw usage records older than `usage_retention_days` are purged.

A thread purges once at start and then every `interval_s`, deleting the raw rows of
whole UTC hours that ended at least the retention ago (usage_store.purge_raw_usage
keeps what billing still reads: the hourly rollups, and the raw rows of hours in which
a price changed). Each purge that removed rows writes one `usage.purge` audit record
with the count, so an auditor can tell records that aged out from records that went
missing. Several processes on one database may all run it: a purge another one has
already done deletes nothing and records nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from admin.audit_writer import TRANSIENT, AuditWriter
from admin.usage_store import hour_of, purge_raw_usage

logger = logging.getLogger("cloister.admin")

ACTOR = "system:retention"
PURGE_INTERVAL_S = 3600.0  # rows age out by the hour, so a purge an hour is enough
# Rows deleted per transaction: between two, the usage writer may take SQLite's lock.
PURGE_CHUNK = 5000


class UsageRetention:
    """Purges raw usage past the retention: `start()` once, `close()` at shutdown."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        retention_days: int,
        audit: AuditWriter,
        interval_s: float = PURGE_INTERVAL_S,
        chunk: int = PURGE_CHUNK,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        if isinstance(retention_days, bool) or not isinstance(retention_days, int):
            raise TypeError(f"retention_days must be a whole number, not {retention_days!r}")
        if retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, not {retention_days}")
        self._sessions = sessions
        self._retention = dt.timedelta(days=retention_days)
        self._audit = audit
        self._interval_s = interval_s
        self._chunk = chunk
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def cutoff(self) -> dt.datetime:
        """Rows before this instant are purged: the start of the hour the retention
        began in, so that an hour's rows go together."""
        return hour_of(self._clock() - self._retention)

    def purge_once(self) -> int:
        """One purge, in chunks; returns how many rows it deleted (audited when any)."""
        cutoff = self.cutoff()
        deleted = 0
        while not self._stop.is_set():
            with self._sessions() as session:
                n = purge_raw_usage(session, older_than=cutoff, limit=self._chunk)
            deleted += n
            if n < self._chunk:
                break
        if deleted:
            self._audit.record(
                actor=ACTOR,
                role="system",
                action="usage.purge",
                resource="usage_records",
                outcome="success",
                detail={
                    "deleted": deleted,
                    "before": cutoff.isoformat(),
                    "retention_days": self._retention.days,
                },
            )
            logger.info("purged %d usage records from before %s", deleted, cutoff.isoformat())
        return deleted

    def start(self) -> UsageRetention:
        """Purges now (on the thread, so start-up never waits on a large purge), then
        every `interval_s`."""
        if self._thread is None:
            self._stop.clear()  # a lifespan entered again (tests) purges again
            self._thread = threading.Thread(
                target=self._run, name="cloister-usage-retention", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stops the thread, after the chunk in progress."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.purge_once()
            except TRANSIENT:  # the database is away: the next pass purges what this one left
                logger.warning("usage purge failed; retrying in %.0f s", self._interval_s)
            except Exception:  # a purge never stops the server; the next pass tries again
                logger.exception("usage purge failed")
            self._stop.wait(self._interval_s)
