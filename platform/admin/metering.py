"""`MeteringSink`: the gateway's UsageSink, storing each request's usage exactly once.

    record() / persist() -> journal thread: group-committed, fsynced append to the
                            UsageSpool (JSONL) -> writer thread: spool -> write_usage
                            (DB, idempotent) -> spool cleared up to what was written

Every row reaches the spool (the write-ahead journal) before anything else, so a
process killed with `kill -9` loses nothing it acknowledged: `persist` returns only
once its row is fsynced, and the gateway awaits it before a completed response's
last byte is sent. Concurrent requests share one write and one fsync (group commit).
The writer replays the spool into the database in arrival order and drops what it
wrote; while the database is down the rows stay spooled and are retried. The
database ignores ids it already has, so a row replayed twice (a crash between
commit and clear) is not counted twice. `start` replays a spool left by an
earlier process before the sink accepts anything.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from admin.spool import UsageSpool
from admin.usage_store import write_usage

logger = logging.getLogger("cloister.metering")
Done = Callable[[BaseException | None], None]


class UsageLike(Protocol):
    """The fields of gateway.usage.UsageRecord that metering reads (adapter,
    client_request_id and batch optional).

    Read-only members, so that frozen records satisfy it.
    """

    @property
    def request_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def ttft_s(self) -> float | None: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def status(self) -> int: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def client_disconnected(self) -> bool: ...


def usage_row(usage: UsageLike, occurred_at: dt.datetime) -> dict[str, Any]:
    """A usage record as the JSON row the spool and write_usage use."""
    return {
        "request_id": usage.request_id,
        "occurred_at": occurred_at.astimezone(dt.UTC).isoformat(),
        "tenant_id": usage.tenant_id,
        "key_id": usage.key_id,
        "model": usage.model,
        "adapter": getattr(usage, "adapter", None) or "",
        "prompt_tokens": int(usage.prompt_tokens),
        "cached_tokens": int(usage.cached_tokens),
        "completion_tokens": int(usage.completion_tokens),
        "ttft_s": usage.ttft_s,
        "latency_s": float(usage.latency_s),
        "status": int(usage.status),
        "finish_reason": usage.finish_reason,
        "client_disconnected": bool(usage.client_disconnected),
        "client_request_id": getattr(usage, "client_request_id", None),
        "batch": bool(getattr(usage, "batch", False)),
    }


class MeteringSink:
    """Implements gateway.usage.UsageSink (and `persist`); `start()` once, `close()` at shutdown."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        spool_path: Path,
        *,
        batch: int = 256,
        retry_s: float = 2.0,
        linger_s: float = 0.05,
        fsync: bool = True,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._sessions = sessions
        self.spool = UsageSpool(spool_path, fsync=fsync)
        self._batch = batch
        self._retry_s = retry_s
        # After a journal commit, wait this long for more so that a busy gateway writes
        # the database once per batch rather than once per request.
        self._linger_s = linger_s
        self._clock = clock
        self._cond = threading.Condition()  # guards the journal queue and pass counters
        self._journal: list[tuple[dict[str, Any], Done | None]] = []
        self._in_flight = 0  # rows accepted and not yet spooled
        self._unspooled: list[dict[str, Any]] = []  # rows the spool refused (disk error)
        self._passes_started = 0
        self._passes_done = 0
        self._replay_lock = threading.Lock()  # one read-write-clear of the spool at a time
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._journal_thread: threading.Thread | None = None
        self._thread: threading.Thread | None = None
        self.db_failures = 0  # database passes that failed (for tests and metrics)

    def record(self, usage: UsageLike) -> None:
        """Accepts one request's usage (stamped now: its price is the one in force now).

        Returns at once; the row is journaled by the next group commit.
        """
        self._submit(usage_row(usage, self._clock()), None)

    async def persist(self, usage: UsageLike) -> None:
        """Like `record`, but returns only once the row is fsynced to the spool.

        Never raises: a spool failure is logged (the row then goes to the database from
        memory), so metering cannot fail a tenant's request.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def done(_error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_resolve, future)

        self._submit(usage_row(usage, self._clock()), done)
        await future

    def _submit(self, row: dict[str, Any], done: Done | None) -> None:
        with self._cond:
            self._journal.append((row, done))
            self._in_flight += 1
            self._cond.notify_all()

    def start(self) -> MeteringSink:
        """Replays any spool left by an earlier process, then starts the two threads."""
        if self._thread is None:
            self.drain_spool()
            self._journal_thread = threading.Thread(
                target=self._journal_run, name="metering-journal", daemon=True
            )
            self._journal_thread.start()
            self._thread = threading.Thread(target=self._run, name="metering", daemon=True)
            self._thread.start()
        return self

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every accepted record is spooled and a database pass ran after it."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._in_flight:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    return False
            started = self._passes_started
        self._wake.set()
        with self._cond:
            while self._passes_done <= started:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    return False
        return True

    def drain_spool(self) -> bool:
        """Replays the spool now (from the caller's thread); True when it is empty after."""
        try:
            self._replay()
        except Exception:
            logger.warning("spool replay failed; database still unavailable")
        return not self.spool.pending()

    def close(self, timeout_s: float = 30.0) -> None:
        """Spools and writes everything accepted (as far as the database allows), then stops."""
        self.flush(timeout_s)
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._wake.set()
        for thread in (self._journal_thread, self._thread):
            if thread is not None:
                thread.join(timeout_s)
        self._journal_thread = self._thread = None

    def _journal_run(self) -> None:
        while True:
            with self._cond:
                while not self._journal and not self._stopping.is_set():
                    self._cond.wait()
                batch, self._journal = self._journal, []
            if not batch:
                return  # stopping, and nothing left
            rows = [row for row, _ in batch]
            error: BaseException | None = None
            try:
                self.spool.append(rows)  # one write and one fsync for the whole group
            except Exception as exc:  # disk full or gone: keep the rows for the database
                error = exc
                logger.exception("usage spool append failed; %d rows kept in memory", len(rows))
            with self._cond:
                if error is not None:
                    self._unspooled.extend(rows)
                self._in_flight -= len(batch)
                self._cond.notify_all()
            for _, done in batch:
                if done is not None:
                    done(error)
            self._wake.set()

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self._retry_s)
            self._wake.clear()
            if woken and not self._stopping.is_set():
                time.sleep(self._linger_s)
            self._pass()
            if self._stopping.is_set():
                with self._cond:
                    idle = not self._journal and not self._in_flight
                if idle:
                    return

    def _pass(self) -> None:
        """One attempt to move spooled (and unspoolable) rows into the database."""
        with self._cond:
            self._passes_started += 1
            number = self._passes_started
            unspooled, self._unspooled = self._unspooled, []
        try:
            if unspooled:
                try:
                    self._write(unspooled)
                except Exception:
                    with self._cond:
                        self._unspooled[:0] = unspooled
                    raise
            if self.spool.pending():
                self._replay()
        except Exception:
            self.db_failures += 1
            logger.warning("database unavailable; usage records stay in the spool")
        finally:
            with self._cond:
                self._passes_done = number
                self._cond.notify_all()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        for start in range(0, len(rows), self._batch):
            with self._sessions() as session:
                write_usage(session, rows[start : start + self._batch])

    def _replay(self) -> None:
        with self._replay_lock:
            rows, lines = self.spool.read()
            self._write(rows)
            if lines:
                self.spool.clear(lines)
                logger.debug("wrote %d spooled usage records", len(rows))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
