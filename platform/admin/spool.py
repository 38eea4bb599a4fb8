"""A durable append-only JSONL spool for usage rows that could not reach the database.

Each append is written and fsynced before it returns, so a record the writer
accepted survives a crash. A torn last line (a crash mid-append) is skipped on
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


class UsageSpool:
    """The local spool file; thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

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
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, data.encode("utf-8"))
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
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("".join(ln + "\n" for ln in rest))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
