"""`AuditWriter`: request paths hand audit records to one background thread.

No request waits for an audit write or holds a second database connection for
one: `record` puts the record on a bounded queue and returns; one thread appends
records to the `AuditLog` in order (so SQLite's single writer lock and the
chain's sequence are taken by one writer per process). When the queue is full a
record is counted and dropped, and the thread writes one `audit.overflow` record
with the count as soon as it can, so a loss is never silent. A write is retried
while the database cannot be reached, in order; a record the database refuses for
good is replaced by an `audit.unwritable` note of its action and actor, so that it
cannot hold up every record behind it.

Denials (bad credentials, forbidden calls) are aggregated: one record per
(source, actor, outcome, resource) per `denial_window_s`, with the count, the first and
last time, and the reasons and actions seen, instead of a row per attempt.
Readers of the log call `flush` first, which writes everything pending,
including the denial windows still open.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from admin.audit_log import AuditLog

logger = logging.getLogger("cloister.admin")

MAX_PENDING = 10_000
MAX_WINDOWS = 10_000  # distinct windows open at once; beyond, sources are folded together
MAX_LISTED = 20  # distinct reasons/actions listed in one aggregate record
RETRY_S = 1.0
AUTH_OUTCOMES = ("denied:401", "denied:429")  # bad or throttled credentials
# Failures a later try may not meet: the database unreachable, locked or busy, its pool
# exhausted, or appends that kept conflicting with another process's (a RuntimeError).
TRANSIENT = (OperationalError, InterfaceError, PoolTimeoutError, OSError, RuntimeError)


@dataclass
class _Window:
    """Denials of one (source, actor, role, tenant, outcome, resource) in the current window."""

    opened: float
    first_at: str
    last_at: str
    count: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)
    resource: str = ""


_WindowKey = tuple[str | None, str, str, str | None, str, str]


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _bump(counts: dict[str, int], name: str) -> None:
    if name in counts or len(counts) < MAX_LISTED:
        counts[name] = counts.get(name, 0) + 1
    else:
        counts["(other)"] = counts.get("(other)", 0) + 1


class AuditWriter:
    """A non-blocking front of an `AuditLog`; see the module docstring."""

    def __init__(
        self,
        log: AuditLog,
        *,
        denial_window_s: float = 60.0,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._window_s = denial_window_s
        self._clock = clock
        self._queue: queue.Queue[dict[str, Any] | threading.Event] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        self._windows: dict[_WindowKey, _Window] = {}
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def record(self, **fields: Any) -> None:
        """Queues one record (the keyword arguments of `AuditLog.record`); never blocks."""
        self._start()
        try:
            self._queue.put_nowait(fields)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def denied(
        self,
        *,
        source: str | None,
        actor: str,
        role: str,
        outcome: str,
        action: str,
        resource: str,
        reason: str,
        tenant_id: str | None = None,
    ) -> None:
        """Counts one denial into its window (written when the window closes)."""
        self._start()
        key: _WindowKey = (source, actor, role, tenant_id, outcome, resource)
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                if len(self._windows) >= MAX_WINDOWS:
                    key = (None, "(many sources)", "none", None, outcome, resource)
                    window = self._windows.get(key)
                if window is None:
                    now = _now_iso()
                    window = _Window(opened=self._clock(), first_at=now, last_at=now)
                    window.resource = resource
                    self._windows[key] = window
            window.count += 1
            window.last_at = _now_iso()
            _bump(window.reasons, reason)
            _bump(window.actions, action)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Writes everything pending, open denial windows included; False on timeout."""
        self._close_windows(force=True)
        if self._thread is None or not self._thread.is_alive():  # none, or closed: no waiting
            self._drain_inline()
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self) -> None:
        """Writes what is pending and stops the thread; closing again only writes what
        came since (`cloister serve` closes it from two shutdown hooks)."""
        self.flush()
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(threading.Event())  # wakes the thread to see _closed
            self._thread.join(timeout=10)

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="cloister-audit", daemon=True
                    )
                    self._thread.start()

    def _close_windows(self, *, force: bool) -> None:
        now = self._clock()
        with self._lock:
            due = [
                (k, w)
                for k, w in self._windows.items()
                if force or now - w.opened >= self._window_s
            ]
            for k, _w in due:
                del self._windows[k]
        for (source, actor, role, tenant_id, outcome, _resource), w in due:
            self.record(
                actor=actor,
                role=role,
                tenant_id=tenant_id,
                action="auth.denied" if outcome in AUTH_OUTCOMES else "access.denied",
                resource=w.resource,
                outcome=outcome,
                source_ip=source,
                detail={
                    "count": w.count,
                    "first_at": w.first_at,
                    "last_at": w.last_at,
                    "reasons": w.reasons,
                    "actions": w.actions,
                },
            )

    def _write(self, fields: dict[str, Any]) -> None:
        """Appends one record, retrying while the database cannot be reached (to keep
        the order); one it refuses for good is replaced by an `audit.unwritable` note."""
        try:
            self._append(fields)
        except Exception as exc:  # refused for good: note it, and let the rest through
            logger.exception("an audit record cannot be written: %s", fields.get("action"))
            note = {
                "actor": "system",
                "role": "none",
                "action": "audit.unwritable",
                "resource": str(fields.get("resource", "")),
                "outcome": "error",
                "tenant_id": fields.get("tenant_id"),
                "detail": {
                    "action": str(fields.get("action")),
                    "actor": str(fields.get("actor")),
                    "error": type(exc).__name__,
                },
            }
            try:
                self._append(note)
            except Exception:
                logger.exception("the note of an unwritable audit record cannot be written")

    def _append(self, fields: dict[str, Any]) -> None:
        while True:
            try:
                self._log.record(**fields)
                return
            except TRANSIENT as exc:  # database down or locked: keep the order, try again
                logger.warning("audit write delayed: %s", type(exc).__name__)
                if self._closed:
                    return
                time.sleep(RETRY_S)

    def _write_overflow(self) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if dropped:
            logger.error("audit queue overflowed: %d records dropped", dropped)
            self._write(
                {
                    "actor": "system",
                    "role": "none",
                    "action": "audit.overflow",
                    "resource": "audit",
                    "outcome": "error",
                    "detail": {"dropped": dropped},
                }
            )

    def _drain_inline(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, dict):
                self._write(item)

    def _run(self) -> None:
        while not self._closed:
            try:
                item = self._queue.get(timeout=min(1.0, self._window_s))
            except queue.Empty:
                item = None
            if isinstance(item, dict):
                self._write(item)
            self._write_overflow()
            if isinstance(item, threading.Event):
                item.set()
            self._close_windows(force=False)
