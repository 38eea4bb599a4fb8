"""The files of the disk KV tier (L3): a background writer, reads, deletes, the start scan.

Writes and deletes go through one FIFO queue served by one daemon thread, so they
happen in the order the tier issued them and a step never waits for the disk. A
write goes to a temporary file renamed into place, so a crash leaves either the old
state or a whole file (and the digest catches the rest). Until its file is written,
a block is read from memory (`_pending`), so a lookup right after a spill still hits.

A write that fails (a full disk, a directory made read-only under us) marks the store
failed with one warning; the tier then writes nothing more and keeps serving what is
on disk. A read that fails is a miss. Nothing here raises into a step.

One engine per directory: the tier takes an exclusive `flock` on `LOCK_NAME` in it
(`lock`) before it scans or writes anything, and holds it until `close`. Two engines
on one directory would delete each other's files (every engine deletes what its own
budget drops, and a start scan deletes what it cannot read), and adopt blocks the
other one counts in its own budget. The lock is tied to the open file: a crashed
engine's lock goes with its process, so a stale lock file never keeps a restart out.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import threading
import time
from pathlib import Path

from engine.kv_cache.disk_format import (
    DIGEST_BYTES,
    FIXED_BYTES,
    MAX_HEADER_BYTES,
    SUFFIX,
    BadBlockFile,
    BlockRecord,
    digest,
    encode_header,
    file_name,
    header_length,
    key_of_name,
    parse_header,
)

log = logging.getLogger("engine")

TMP = ".tmp"
# The lock file in the directory (not a block file's name, so the start scan skips it).
LOCK_NAME = ".cloister-kv.lock"
# Bytes of queued writes at most: past this the disk cannot keep up, and a spilled
# block is skipped (a miss later) rather than held in memory without bound.
MAX_PENDING_BYTES = 256 << 20
_Job = tuple[str, bytes, int]  # ("write" | "delete", key, sequence number)


class DiskStore:
    """Block files under `root` for the model of `fingerprint`."""

    def __init__(self, root: Path, fingerprint: bytes, payload_bytes: int) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self.payload_bytes = payload_bytes
        self.failed = False
        self.written = 0
        self.deleted = 0
        self.skipped = 0  # writes dropped because the backlog was full
        self._pending_bytes = 0
        self._lock = threading.Lock()
        # Signalled when queued bytes leave the backlog (a write waits on it while
        # draining, `drain_until`).
        self._room = threading.Condition(self._lock)
        # While draining at shutdown: a full backlog makes `write` wait (up to this
        # time.monotonic()) instead of skipping; None in normal serving.
        self._drain_deadline: float | None = None
        self._abandon = False  # past the drain's deadline: queued writes are dropped
        self._seq = 0
        # Writes queued and not yet on disk: key -> (sequence number, header, payload).
        self._pending: dict[bytes, tuple[int, bytes, bytes]] = {}
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._lock_fd: int | None = None  # the open lock file while `lock` holds it
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-disk-writer", daemon=True)
        self._thread.start()

    # -- from the step thread ---------------------------------------------------------

    def write(self, record: BlockRecord, payload: bytes) -> bool:
        """Queues the file of `record` (the caller's `payload` is not used afterwards);
        False when the backlog is full and the block is skipped (a miss when looked up)."""
        header = encode_header(record, self.fingerprint, len(payload))
        with self._lock:
            if self._drain_deadline is not None:
                # At shutdown nothing waits on a step: wait for room, up to the deadline.
                while self._pending_bytes + len(payload) > MAX_PENDING_BYTES:
                    left = self._drain_deadline - time.monotonic()
                    if left <= 0 or not self._thread.is_alive():
                        break
                    self._room.wait(left)
            if self._pending_bytes + len(payload) > MAX_PENDING_BYTES:
                self.skipped += 1
                if self.skipped == 1:
                    log.warning(
                        "disk KV tier: writes to kv_disk_path=%s fall behind; blocks are "
                        "skipped while %d bytes wait",
                        self.root,
                        self._pending_bytes,
                    )
                return False
            self._seq += 1
            old = self._pending.pop(record.key, None)
            if old is not None:
                self._pending_bytes -= len(old[2])
            self._pending[record.key] = (self._seq, header, payload)
            self._pending_bytes += len(payload)
            self._queue.put(("write", record.key, self._seq))
        return True

    def delete(self, key: bytes) -> None:
        """Queues the deletion of the file of `key` (a write still queued is cancelled)."""
        with self._lock:
            old = self._pending.pop(key, None)
            if old is not None:
                self._pending_bytes -= len(old[2])
            self._seq += 1
            self._queue.put(("delete", key, self._seq))

    def read(self, key: bytes) -> bytearray | None:
        """The whole file of `key` (or its queued bytes); None if it cannot be read."""
        with self._lock:
            pending = self._pending.get(key)
        if pending is not None:
            _, header, payload = pending
            return bytearray(header + payload + digest(header, payload))
        try:
            with open(self.root / file_name(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > MAX_HEADER_BYTES + self.payload_bytes + DIGEST_BYTES:
                    return None
                data = bytearray(size)
                if f.readinto(data) != size:
                    return None
                return data
        except OSError:
            return None

    def flush(self) -> None:
        """Waits until every queued write and delete is done (tests, shutdown)."""
        self._queue.join()

    def drain_until(self, deadline: float) -> None:
        """From now on (shutdown), a write that finds the backlog full waits for room
        until `deadline` (time.monotonic()) rather than skipping its block."""
        with self._lock:
            self._drain_deadline = deadline

    def close(self, timeout_s: float | None = None) -> None:
        """Finishes the queue, stops the writer thread and releases the directory's lock
        (last: another engine may start on the directory only once our writes are done).

        With `timeout_s`, writes still queued after that long are dropped (each a miss
        for the next engine, never a torn block: files are renamed into place) and the
        wait ends once the file being written is done; deletes always run, so what a
        scrub or a budget dropped never outlives us. A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._lock:
                self._abandon = True
                dropped = len(self._pending)
            log.warning(
                "disk KV tier: kv_disk_path=%s did not take its last writes within %.1f s; "
                "%d queued blocks are dropped",
                self.root,
                timeout_s,
                dropped,
            )
            self._thread.join()
        if self._lock_fd is not None:
            # Closing the descriptor drops the flock; the file stays (unlinking it would
            # let a third engine lock a new file while a second holds the old one).
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- the directory's lock ---------------------------------------------------------

    def lock(self) -> bool:
        """Takes the directory's exclusive lock without waiting; False when another open
        lock file holds it (another engine, in this process or another). Raises OSError
        when the lock file cannot be opened."""
        if self._lock_fd is not None:
            return True
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        self._lock_fd = fd
        return True

    # -- the writer thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._do(*job)
            finally:
                self._queue.task_done()

    def _do(self, kind: str, key: bytes, seq: int) -> None:
        if kind == "delete":
            try:
                (self.root / file_name(key)).unlink(missing_ok=True)
                self.deleted += 1
            except OSError as exc:
                self._fail(exc)
            return
        with self._lock:
            pending = self._pending.get(key)
            abandon = self._abandon
        if pending is None or pending[0] != seq:
            return  # deleted or written again since: a later job has the last word
        _, header, payload = pending
        try:
            if not self.failed and not abandon:
                self._write_file(key, header, payload)
                self.written += 1
        except OSError as exc:
            self._fail(exc)
        finally:
            with self._lock:
                if self._pending.get(key) is pending:
                    # Written, or failed (then the block is a miss from now on).
                    del self._pending[key]
                    self._pending_bytes -= len(payload)
                    self._room.notify_all()

    def _write_file(self, key: bytes, header: bytes, payload: bytes) -> None:
        """Writes one block file through a temporary name (patched by tests to fail)."""
        final = self.root / file_name(key)
        tmp = final.with_name(final.name + TMP)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(payload)
                f.write(digest(header, payload))
            os.replace(tmp, final)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _fail(self, exc: OSError) -> None:
        if not self.failed:
            self.failed = True
            what = "the disk is full" if exc.errno == errno.ENOSPC else str(exc)
            log.warning(
                "disk KV tier: a write in kv_disk_path=%s failed (%s); the tier writes "
                "no more blocks",
                self.root,
                what,
            )

    # -- at start ---------------------------------------------------------------------

    def scan(self) -> list[BlockRecord]:
        """The blocks of this model found in the directory. Files of another model or
        revision, torn writes and unreadable block files are deleted; files whose names
        are not block files' are left alone (the directory may hold other things)."""
        found: list[BlockRecord] = []
        dropped = 0
        for entry in os.scandir(self.root):
            name = entry.name
            if name.endswith(SUFFIX + TMP) and key_of_name(name[: -len(TMP)]) is not None:
                Path(entry.path).unlink(missing_ok=True)  # a write cut short
                continue
            key = key_of_name(name)
            if key is None or not entry.is_file(follow_symlinks=False):
                continue
            record = self._check(Path(entry.path), key)
            if record is None:
                Path(entry.path).unlink(missing_ok=True)
                dropped += 1
            else:
                found.append(record)
        if dropped:
            log.warning(
                "disk KV tier: deleted %d block files of another model or revision, or "
                "torn, in kv_disk_path=%s",
                dropped,
                self.root,
            )
        return found

    def _check(self, path: Path, key: bytes) -> BlockRecord | None:
        """The record of a file whose header is this model's and whose size is whole
        (its digest is checked when it is read)."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(FIXED_BYTES)
                head += f.read(header_length(head) - FIXED_BYTES)
            record, start, plen = parse_header(head, self.fingerprint)
        except (OSError, BadBlockFile):
            return None
        if record.key != key or plen != self.payload_bytes:
            return None
        if size != start + plen + DIGEST_BYTES:
            return None
        return record

    def probe_read(self, repeats: int = 3) -> list[tuple[int, float]]:
        """Writes, syncs and reads back a block-sized file: (bytes, seconds) per read.
        Raises OSError when the directory cannot be written (checked at start)."""
        path = self.root / f".probe-{os.getpid()}{TMP}"
        data = os.urandom(min(self.payload_bytes, 1 << 16)) * (
            -(-self.payload_bytes // min(self.payload_bytes, 1 << 16))
        )
        data = data[: self.payload_bytes]
        out: list[tuple[int, float]] = []
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            for _ in range(repeats):
                fd = os.open(path, os.O_RDONLY)
                try:
                    if hasattr(os, "posix_fadvise"):
                        # Measure the disk, not the page cache, where we can.
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    started = time.perf_counter()
                    got = os.read(fd, len(data) + 1)
                    while len(got) < len(data):
                        more = os.read(fd, len(data) - len(got))
                        if not more:
                            break
                        got += more
                    out.append((len(got), time.perf_counter() - started))
                finally:
                    os.close(fd)
        finally:
            path.unlink(missing_ok=True)
        return out
