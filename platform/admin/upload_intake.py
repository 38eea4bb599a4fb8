"""Receiving an upload body: streamed to a file under a size cap, never held in memory.

The cap is checked on Content-Length before a byte is read and again on the
bytes actually received (a client may lie, or send chunked), so a huge body
costs one chunk of memory and at most `cap` bytes of disk. File writes go to a
worker thread so that the event loop only ever moves chunks.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import anyio.to_thread
from fastapi import HTTPException, Request


class UploadTooLarge(HTTPException):
    """The body is over the cap (HTTP 413)."""

    def __init__(self, cap: int) -> None:
        super().__init__(413, f"the upload is larger than {cap} bytes")


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        raise HTTPException(400, "Content-Length is not a number")
    return int(value)


async def receive_to_file(request: Request, target: Path, cap: int) -> int:
    """Writes the request body to `target` (created); returns its size or raises UploadTooLarge."""
    declared = _declared_length(request)
    if declared is not None and declared > cap:
        raise UploadTooLarge(cap)
    size = 0
    out = await anyio.to_thread.run_sync(target.open, "xb")
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise UploadTooLarge(cap)
            if chunk:
                await anyio.to_thread.run_sync(out.write, chunk)
    finally:
        await anyio.to_thread.run_sync(out.close)
    return size


class UploadSlots:
    """At most `total` uploads are received and validated at once; the next is refused (429)."""

    def __init__(self, total: int) -> None:
        self._slots = threading.BoundedSemaphore(total)

    def acquire(self) -> None:
        """Takes a slot without waiting, or raises a 429 with Retry-After."""
        if not self._slots.acquire(blocking=False):
            raise HTTPException(
                429, "too many adapter uploads in progress", headers={"Retry-After": "5"}
            )

    def release(self) -> None:
        """Gives the slot back."""
        self._slots.release()


def new_upload_dir(base: Path) -> Path:
    """A fresh private folder for one upload under `base` (created 0700 if missing)."""
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Path(tempfile.mkdtemp(prefix="upload-", dir=base))


def remove_upload_dir(folder: Path) -> None:
    """Deletes an upload's folder and whatever is left in it."""
    shutil.rmtree(folder, ignore_errors=True)
