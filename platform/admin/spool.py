"""A durable append-only JSONL spool: the write-ahead journal of usage rows.

Each append is written and fsynced before it returns, so a record the writer
accepted survives a crash. The file is the operator's only (mode 0600), also
after a replay rewrites it. A torn last line (a crash mid-append) is skipped on
read: it was never acknowledged. Replay reads in append order; the database
side is idempotent by request id, so replaying twice counts nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("cloister.metering")
MODE = 0o600  # usage rows name tenants and keys: owner only


class UsageSpool:
    """The local spool file; thread-safe."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync  # False only to measure what the fsync costs (bench/)
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            os.chmod(path, MODE)  # a spool left by an older version may be 0644

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Appends rows (one JSON object a line) and fsyncs before returning."""
        if not rows:
            return
        data = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
        with self._lock:
            if self.path.exists() and self.path.stat().st_size:
                with open(self.path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":  # never glue a row onto a torn line
                        data = "\n" + data
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, MODE)
            try:
                _write_all(fd, data.encode("utf-8"))
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def read(self) -> tuple[list[dict[str, Any]], int]:
        """Every complete row in append order, and how many lines they (and a torn tail) span."""
        with self._lock:
            if not self.path.exists():
                return [], 0
            text = self.path.read_text(encoding="utf-8")
        rows: list[dict[str, Any]] = []
        lines = [ln for ln in text.split("\n") if ln]
        for i, line in enumerate(lines):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                # a torn append: it failed, so it was never acknowledged
                logger.warning("skipping torn spool line %d", i + 1)
        return rows, len(lines)

    def pending(self) -> bool:
        """True when the spool holds anything."""
        with self._lock:
            return self.path.exists() and self.path.stat().st_size > 0

    def clear(self, count: int) -> None:
        """Drops the first `count` rows (those replayed), keeping any appended since."""
        with self._lock:
            if not self.path.exists():
                return
            lines = [ln for ln in self.path.read_text(encoding="utf-8").split("\n") if ln]
            rest = lines[count:]
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, MODE)
            try:
                os.fchmod(fd, MODE)  # O_CREAT's mode does not apply to a leftover tmp file
                _write_all(fd, "".join(ln + "\n" for ln in rest).encode("utf-8"))
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            if self._fsync:  # make the rename durable: later appends go to the new file
                dir_fd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a regular file may take a write in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
