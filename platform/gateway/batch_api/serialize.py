"""Stored files and batches as the API's JSON objects."""

from __future__ import annotations

import datetime as dt

from gateway.batch_api.batch_store import BatchInfo
from gateway.batch_api.file_store import FileInfo
from gateway.batch_api.schemas import (
    BatchErrors,
    BatchObject,
    BatchUsage,
    FileObject,
    RequestCounts,
)


def _unix(stamp: dt.datetime | None) -> int | None:
    return None if stamp is None else int(stamp.timestamp())


def file_object(info: FileInfo) -> FileObject:
    """The OpenAI file object of a stored file."""
    return FileObject(
        id=info.id,
        bytes=info.bytes,
        created_at=int(info.created_at.timestamp()),
        filename=info.filename,
        purpose=info.purpose,
    )


def batch_object(info: BatchInfo) -> BatchObject:
    """The OpenAI batch object of a stored batch, with its progress so far."""
    counts = info.counts
    return BatchObject(
        id=info.id,
        endpoint=info.endpoint,
        errors=None if not info.errors else BatchErrors(data=info.errors),
        input_file_id=info.input_file_id,
        completion_window=info.completion_window,
        status=info.status,
        output_file_id=info.output_file_id,
        error_file_id=info.error_file_id,
        created_at=int(info.created_at.timestamp()),
        expires_at=_unix(info.expires_at),
        in_progress_at=_unix(info.times["in_progress_at"]),
        finalizing_at=_unix(info.times["finalizing_at"]),
        completed_at=_unix(info.times["completed_at"]),
        failed_at=_unix(info.times["failed_at"]),
        expired_at=_unix(info.times["expired_at"]),
        cancelling_at=_unix(info.times["cancelling_at"]),
        cancelled_at=_unix(info.times["cancelled_at"]),
        request_counts=RequestCounts(
            total=info.total_lines, completed=counts.completed, failed=counts.failed
        ),
        metadata=info.metadata,
        usage=BatchUsage(
            input_tokens=counts.prompt_tokens,
            input_tokens_details={"cached_tokens": 0},
            output_tokens=counts.completion_tokens,
            output_tokens_details={"reasoning_tokens": 0},
            total_tokens=counts.prompt_tokens + counts.completion_tokens,
        ),
    )
