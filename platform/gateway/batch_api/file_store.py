"""Tenant files: metadata rows in the database, bytes in a `BlobStore` (the data
directory's <data_dir>/files, or an S3-compatible bucket).

Every read names the tenant: a file of another tenant is the same "not found" as a
file that never existed, and a body's key is built from the row's own tenant. Uploads
are received into <root>/.staging on local disk first, whatever the store. Blocking
(database, disk, network): callers run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.batch_api.blob_store import (
    STAGING_DIR,
    BlobMissingError,
    BlobStore,
    LocalBlobStore,
    blob_key,
)
from gateway.batch_api.errors import QuotaExceededError, ResourceNotFoundError, well_formed_id
from gateway.batch_api.tables import StoredFile
from server.field_copy import copy_fields
from tenancy.models import utcnow

UPLOAD_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"


@dataclass(frozen=True)
class FileLimits:
    """Caps on one upload and on what one tenant may hold."""

    max_file_bytes: int
    max_file_lines: int
    max_files_per_tenant: int
    max_bytes_per_tenant: int


@dataclass(frozen=True)
class FileInfo:
    """One stored file as the API describes it."""

    id: str
    tenant_id: str
    filename: str
    purpose: str
    bytes: int
    lines: int
    created_at: dt.datetime


def _info(row: StoredFile) -> FileInfo:
    return copy_fields(FileInfo, row)


def _owned(session: Session, tenant_id: str, file_id: str) -> StoredFile:
    row = session.get(StoredFile, file_id) if well_formed_id(file_id) else None
    if row is None or row.tenant_id != tenant_id:
        raise ResourceNotFoundError(
            f"no file with id {file_id[:80]!r}", param="file_id", code="file_not_found"
        )
    return row


def new_file_id() -> str:
    """A fresh, unguessable file id in OpenAI's spelling."""
    return f"file-{secrets.token_hex(12)}"


class FileStore:
    """Files per tenant; see the module docstring."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        root: Path,
        limits: FileLimits,
        blobs: BlobStore | None = None,
    ) -> None:
        self._sessions = sessions
        self._root = root
        self.limits = limits
        self.blobs: BlobStore = blobs if blobs is not None else LocalBlobStore(root)

    def staging_path(self) -> Path:
        """A fresh path for an upload being received (stored by `add`)."""
        staging = self._root / STAGING_DIR
        staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        return staging / secrets.token_hex(16)

    def _usage(self, session: Session, tenant_id: str) -> tuple[int, int]:
        count, total = session.execute(
            select(func.count(), func.coalesce(func.sum(StoredFile.bytes), 0)).where(
                StoredFile.tenant_id == tenant_id
            )
        ).one()
        return int(count), int(total)

    def check_room(self, tenant_id: str, incoming_bytes: int = 0) -> None:
        """QuotaExceededError when the tenant holds its file cap, or `incoming_bytes` more
        would pass its byte cap."""
        with self._sessions() as session:
            count, total = self._usage(session, tenant_id)
        if count >= self.limits.max_files_per_tenant:
            raise QuotaExceededError(
                f"this tenant already holds {count} files, its limit; delete some first",
                code="file_quota_exceeded",
            )
        if total + incoming_bytes > self.limits.max_bytes_per_tenant:
            raise QuotaExceededError(
                f"this tenant's files would pass its {self.limits.max_bytes_per_tenant} bytes;"
                " delete some first",
                code="file_quota_exceeded",
            )

    def add(
        self, tenant_id: str, *, filename: str, purpose: str, staged: Path, size: int, lines: int
    ) -> FileInfo:
        """Stores a received upload and records it (rechecking the caps, since other
        uploads of the tenant may have landed meanwhile). The body is stored before the
        row exists, so a listed file always has its bytes."""
        try:
            self.check_room(tenant_id, size)
            file_id = new_file_id()
            key = blob_key(tenant_id, file_id)
            self.blobs.put_staged(key, staged)
        finally:
            staged.unlink(missing_ok=True)
        row = StoredFile(
            id=file_id,
            tenant_id=tenant_id,
            filename=filename,
            purpose=purpose,
            bytes=size,
            lines=lines,
            path=key,
            created_at=utcnow(),
        )
        try:
            with self._sessions.begin() as session:
                session.add(row)
        except Exception:
            with contextlib.suppress(Exception):  # the row's error is the one to report
                self.blobs.delete(key)
            raise
        return self.get(tenant_id, file_id)

    def write_generated(
        self, tenant_id: str, file_id: str, *, filename: str, chunks: Iterable[bytes]
    ) -> FileInfo:
        """Writes a batch's output or error file under a fixed id; writing it again (a
        finalization redone after a restart) replaces it, so it never exists twice."""
        key = blob_key(tenant_id, file_id)
        size = lines = 0

        def counted() -> Iterator[bytes]:
            nonlocal size, lines
            for chunk in chunks:
                size += len(chunk)
                lines += chunk.count(b"\n")
                yield chunk

        self.blobs.put_chunks(key, counted())
        with self._sessions.begin() as session:
            row = session.get(StoredFile, file_id)
            if row is None:
                row = StoredFile(id=file_id, tenant_id=tenant_id, created_at=utcnow())
                session.add(row)
            row.filename = filename
            row.purpose = OUTPUT_PURPOSE
            row.bytes = size
            row.lines = lines
            row.path = key
        return self.get(tenant_id, file_id)

    def get(self, tenant_id: str, file_id: str) -> FileInfo:
        """The tenant's file `file_id`, or ResourceNotFoundError."""
        with self._sessions() as session:
            return _info(_owned(session, tenant_id, file_id))

    def open_content(self, tenant_id: str, file_id: str) -> tuple[FileInfo, BinaryIO]:
        """The tenant's file and a stream of its bytes (to close), after the ownership
        check; ResourceNotFoundError also when the bytes are gone."""
        with self._sessions() as session:
            row = _owned(session, tenant_id, file_id)
            info, key = _info(row), row.path
        try:
            return info, self.blobs.open(key)
        except BlobMissingError:
            raise ResourceNotFoundError(
                f"the content of file {file_id!r} is gone", param="file_id", code="file_not_found"
            ) from None

    def page(
        self, tenant_id: str, *, purpose: str | None, limit: int, after: str | None, order: str
    ) -> tuple[list[FileInfo], bool]:
        """A page of the tenant's files (newest first for order "desc") and whether more follow."""
        with self._sessions() as session:
            query = select(StoredFile).where(StoredFile.tenant_id == tenant_id)
            if purpose is not None:
                query = query.where(StoredFile.purpose == purpose)
            newest_first = order == "desc"
            if well_formed_id(after):
                anchor = session.get(StoredFile, after)
                if anchor is not None and anchor.tenant_id == tenant_id:
                    key = (anchor.created_at, anchor.id)
                    if newest_first:
                        query = query.where(
                            (StoredFile.created_at < key[0])
                            | ((StoredFile.created_at == key[0]) & (StoredFile.id < key[1]))
                        )
                    else:
                        query = query.where(
                            (StoredFile.created_at > key[0])
                            | ((StoredFile.created_at == key[0]) & (StoredFile.id > key[1]))
                        )
            ordering = (
                (StoredFile.created_at.desc(), StoredFile.id.desc())
                if newest_first
                else (StoredFile.created_at.asc(), StoredFile.id.asc())
            )
            rows = session.scalars(query.order_by(*ordering).limit(limit + 1)).all()
            return [_info(r) for r in rows[:limit]], len(rows) > limit

    def delete(self, tenant_id: str, file_id: str) -> None:
        """Deletes the tenant's file: its bytes, then its row. A store that is down leaves
        both (a 503 to retry) rather than an object no row lists any more."""
        with self._sessions() as session:
            key = _owned(session, tenant_id, file_id).path
        self.blobs.delete(key)
        with self._sessions.begin() as session:
            row = session.get(StoredFile, file_id)
            if row is not None and row.tenant_id == tenant_id:
                session.delete(row)
