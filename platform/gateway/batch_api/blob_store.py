"""Where the bytes of tenant files live: the `BlobStore` protocol and the data directory.

A body is stored under the key "<tenant id>/<file id>"; the tenant part comes from the
authenticated principal (or the batch's own row), never from the client. Every method
blocks (disk or network): async callers run them in a worker thread. A store that
cannot be reached raises `FileStoreUnavailableError` (503 at the edge), so a failed
storage call is never a 500; a body that is gone raises `BlobMissingError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

from gateway.batch_api.errors import well_formed_id
from gateway.errors import GatewayError

STAGING_DIR = ".staging"  # under the local root; uploads are received there first
DIR_MODE = 0o700


class FileStoreUnavailableError(GatewayError):
    """The file store cannot be reached right now (503: try again later)."""

    status = 503
    type = "service_unavailable"


class BlobMissingError(Exception):
    """No body is stored under the key (its metadata row outlived it)."""


class FileStoreConfigError(ValueError):
    """The configured file store is unusable at start-up (one line, no secret)."""


def blob_key(tenant_id: str, file_id: str) -> str:
    """The key of a tenant's file; both parts are ids this server made, so neither can
    climb out of the tenant's folder or prefix."""
    if not (well_formed_id(tenant_id) and well_formed_id(file_id)):
        raise ValueError("a file key is made of a tenant id and a file id")
    return f"{tenant_id}/{file_id}"


def unavailable(action: str) -> FileStoreUnavailableError:
    """The 503 of a failed storage call; names what failed, never the store's secrets."""
    return FileStoreUnavailableError(
        f"the file store is unavailable ({action}); try again later",
        code="file_store_unavailable",
    )


class BlobStore(Protocol):
    """Bodies of tenant files by key; see the module docstring."""

    def check(self) -> None:
        """FileStoreConfigError when the store cannot be used (checked once at start)."""
        ...

    def put_staged(self, key: str, staged: Path) -> None:
        """Stores the staged local file under `key`; `staged` may be moved away."""
        ...

    def put_chunks(self, key: str, chunks: Iterable[bytes]) -> None:
        """Stores the concatenated `chunks` under `key`, replacing any body there; the
        body appears whole or not at all."""
        ...

    def open(self, key: str) -> BinaryIO:
        """The body under `key` as a stream to read and close (never loaded whole)."""
        ...

    def delete(self, key: str) -> None:
        """Removes the body under `key`; a missing one is no error."""
        ...


class LocalBlobStore:
    """Bodies as files under a data-directory folder: <root>/<tenant id>/<file id>."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def check(self) -> None:
        """The folder, made at the first upload, is not taken by a file."""
        if self._root.exists() and not self._root.is_dir():
            raise FileStoreConfigError(f"cannot use the files folder {self._root}: not a folder")

    def _path(self, key: str) -> Path:
        target = self._root / key
        target.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        return target

    def put_staged(self, key: str, staged: Path) -> None:
        """Moves the staged file into place (same file system: the staging folder is
        inside the root)."""
        os.replace(staged, self._path(key))

    def put_chunks(self, key: str, chunks: Iterable[bytes]) -> None:
        """Writes a partial file, syncs it, then renames it over the key's file."""
        target = self._path(key)
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, target)

    def open(self, key: str) -> BinaryIO:
        """The file, open for reading."""
        try:
            return (self._root / key).open("rb")
        except FileNotFoundError:
            raise BlobMissingError(key) from None

    def delete(self, key: str) -> None:
        """Unlinks the file."""
        (self._root / key).unlink(missing_ok=True)
