"""A durable append-only JSONL spool: the write-ahead journal of usage rows.

Each append is written and fsynced before it returns, so a record the writer
accepted survives a crash. The file is the operator's only (mode 0600), also
after a replay rewrites it. A torn last line (a crash mid-append) is skipped on
read: it was never acknowledged. Replay reads in append order; the database
side is idempotent by request id, so replaying twice counts nothing twice.

Two processes may share one spool (two gateways started on one data folder). Every
append, read and clear holds an advisory lock on a sibling `.lock` file as well as
the in-process lock, and `clear` drops exactly the lines that were read rather than
the first N: another process may have cleared (and appended) in between, and a count
would then drop rows nobody wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("cloister.metering")
MODE = 0o600  # usage rows name tenants and keys: owner only


class UsageSpool:
    """The local spool file; thread-safe."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync  # False only to measure what the fsync costs (bench/)
        self._thread_lock = threading.Lock()
        self._lock_path = path.with_name(path.name + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            os.chmod(path, MODE)  # a spool left by an older version may be 0644

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's threads, then other processes sharing the file, one at a time."""
        with self._thread_lock:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Appends rows (one JSON object a line) and fsyncs before returning."""
        if not rows:
            return
        data = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
        with self._locked():
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

    def read(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every complete row in append order, and the lines read (torn ones too), which
        `clear` takes back once the rows are written."""
        with self._locked():
            if not self.path.exists():
                return [], []
            text = self.path.read_text(encoding="utf-8")
        rows: list[dict[str, Any]] = []
        lines = [ln for ln in text.split("\n") if ln]
        for i, line in enumerate(lines):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                # a torn append: it failed, so it was never acknowledged
                logger.warning("skipping torn spool line %d", i + 1)
        return rows, lines

    def pending(self) -> bool:
        """True when the spool holds anything."""
        with self._locked():
            return self.path.exists() and self.path.stat().st_size > 0

    def clear(self, replayed: Sequence[str]) -> None:
        """Drops the lines `read` returned (their rows are written), keeping every other
        line: those appended since, by this process or another."""
        with self._locked():
            if not self.path.exists():
                return
            lines = [ln for ln in self.path.read_text(encoding="utf-8").split("\n") if ln]
            drop = Counter(replayed)
            rest = []
            for line in lines:
                if drop[line] > 0:
                    drop[line] -= 1
                else:
                    rest.append(line)
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
