"""`MeteringSink`: the gateway's UsageSink, storing each request's usage exactly once.

    record() -> in-memory queue -> writer thread -> write_usage (DB, idempotent)
                                         | DB error
                                         v
                                  UsageSpool (fsynced JSONL) -> replayed in order

`record` never blocks on the database (it only enqueues), so metering adds
microseconds to a request. While the spool holds rows, new rows are appended
behind them, so replay keeps arrival order; the database ignores ids it already
has, so a write whose commit landed but whose acknowledgement was lost is not
counted twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from admin.spool import UsageSpool
from admin.usage_store import write_usage

logger = logging.getLogger("cloister.metering")


class UsageLike(Protocol):
    """The fields of gateway.usage.UsageRecord that metering reads (adapter optional).

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
    }


class MeteringSink:
    """Implements gateway.usage.UsageSink; call `start()` once and `close()` at shutdown."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        spool_path: Path,
        *,
        batch: int = 256,
        retry_s: float = 2.0,
        linger_s: float = 0.05,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._sessions = sessions
        self.spool = UsageSpool(spool_path)
        self._batch = batch
        self._retry_s = retry_s
        # After the first record, wait this long for more so that a busy gateway commits
        # once per batch rather than once per request.
        self._linger_s = linger_s
        self._clock = clock
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.db_failures = 0  # writes that went to the spool instead (for tests and metrics)

    def record(self, usage: UsageLike) -> None:
        """Accepts one request's usage; stamped now (its price is the one in force now)."""
        self._queue.put(usage_row(usage, self._clock()))

    def start(self) -> MeteringSink:
        """Starts the writer thread (replaying any spool left by an earlier process)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="metering", daemon=True)
            self._thread.start()
        return self

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every accepted record is in the database or the spool."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def drain_spool(self) -> bool:
        """Replays the spool now (from the caller's thread); True when it is empty after."""
        try:
            self._replay()
        except Exception:
            logger.warning("spool replay failed; database still unavailable")
        return not self.spool.pending()

    def close(self, timeout_s: float = 30.0) -> None:
        """Writes or spools everything accepted, then stops the writer."""
        self.flush(timeout_s)
        self._stopping.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _replay(self) -> None:
        rows, lines = self.spool.read()
        for start in range(0, len(rows), self._batch):
            with self._sessions() as session:
                write_usage(session, rows[start : start + self._batch])
        if lines:
            self.spool.clear(lines)
            logger.info("replayed %d spooled usage records", len(rows))

    def _take_batch(self) -> tuple[list[dict[str, Any]], int]:
        """Up to `batch` rows; waits at most retry_s for the first. Returns (rows, items taken)."""
        rows: list[dict[str, Any]] = []
        taken = 0
        try:
            item = self._queue.get(timeout=self._retry_s)
        except queue.Empty:
            return rows, 0
        taken += 1
        if item is None:
            return rows, taken
        rows.append(item)
        # Sleep through the linger, then take what came: waiting on the queue instead
        # would wake this thread once per record, taking the GIL from the gateway's
        # event loop once per request. A backlog of a full batch needs no linger.
        if not self._stopping.is_set() and self._queue.qsize() < self._batch - 1:
            time.sleep(self._linger_s)
        while len(rows) < self._batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            taken += 1
            if item is None:  # close(): write what we have now
                break
            rows.append(item)
        return rows, taken

    def _run(self) -> None:
        while True:
            rows, taken = self._take_batch()
            try:
                self._store(rows)
            except Exception:  # last resort: the spool itself failed; keep the thread alive
                logger.exception("usage rows could not be stored or spooled")
            finally:
                for _ in range(taken):
                    self._queue.task_done()
            if self._stopping.is_set() and self._queue.empty():
                return

    def _store(self, rows: list[dict[str, Any]]) -> None:
        if self.spool.pending():
            try:
                self._replay()
            except Exception:
                self.db_failures += 1
                self.spool.append(rows)  # keep arrival order behind the spooled rows
                return
        if not rows:
            return
        try:
            with self._sessions() as session:
                write_usage(session, rows)
        except Exception:
            self.db_failures += 1
            logger.warning("database unavailable; spooling %d usage records", len(rows))
            self.spool.append(rows)
