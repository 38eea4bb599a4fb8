"""The Batch API's tables: uploaded files, batches, and each batch line's result.

Schema changes go through a new Alembic revision in migrations/versions/.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from tenancy.models import Base, UTCDateTime, utcnow


class StoredFile(Base):
    """One file of a tenant: an upload (purpose "batch") or a batch's output or errors.

    The bytes live under the data directory (`path`, relative to its files folder);
    the row is what the API lists, and what proves who owns the file.
    """

    __tablename__ = "batch_files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    filename: Mapped[str] = mapped_column(String(256))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(Integer, default=0)
    path: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class BatchJob(Base):
    """One batch: its input file, endpoint, status and the times OpenAI's object reports."""

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_status", "status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    # The key that created it: its lines run as that key (its model allow-list, its
    # cache domain), and stop if the key is revoked.
    key_id: Mapped[str] = mapped_column(String(32))
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    total_lines: Mapped[int] = mapped_column(Integer)
    # The queued-token estimate the tenant's batch token budget is charged with.
    estimated_tokens: Mapped[int] = mapped_column(BigInteger)
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, default=None)
    output_file_id: Mapped[str | None] = mapped_column(String(64), default=None)
    error_file_id: Mapped[str | None] = mapped_column(String(64), default=None)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    in_progress_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    finalizing_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    failed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    expired_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    cancelling_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    cancelled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Which gateway's runner works on the batch, until when: with several gateways on one
    # database, one runs it; another takes over once the lease lapses (its holder died).
    claimed_by: Mapped[str | None] = mapped_column(String(64), default=None)
    claimed_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)


class BatchLineResult(Base):
    """The result of one line of a batch, written once: its presence marks the line done.

    (batch_id, line) is the key, so a line can never be recorded twice, and a
    restarted runner runs exactly the lines that have no row.
    """

    __tablename__ = "batch_line_results"

    batch_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str | None] = mapped_column(String(512), default=None)
    status_code: Mapped[int] = mapped_column(Integer)  # 0: the line never reached a route
    # OpenAI's output line object ("id", "custom_id", "response", "error"), as written.
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
