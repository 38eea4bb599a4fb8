"""Batches in the database: created, read and cancelled by the API, run by the runner.

A line is done once its result row exists (BatchLineResult: one row per line, by
key), so the runner's question after a restart, "which lines are left?", has one
answer. Blocking (database): callers run it in a worker thread.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway.batch_api.errors import (
    BatchStateError,
    QuotaExceededError,
    ResourceNotFoundError,
    well_formed_id,
)
from gateway.batch_api.tables import BatchJob, BatchLineResult
from server.field_copy import copy_fields
from tenancy.models import utcnow

COMPLETION_WINDOW = dt.timedelta(hours=24)
# A batch in one of these still holds its share of the tenant's batch token budget,
# and the runner has work (or finishing) to do on it.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
ENDED = ("completed", "failed", "expired", "cancelled")
_TIMES = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


@dataclass(frozen=True)
class LineCounts:
    """A batch's finished lines: how many succeeded and failed, and their tokens."""

    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class BatchInfo:
    """One batch as the API and the runner see it."""

    id: str
    tenant_id: str
    key_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    total_lines: int
    estimated_tokens: int
    metadata: dict[str, Any] | None
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None
    created_at: dt.datetime
    expires_at: dt.datetime
    times: dict[str, dt.datetime | None]
    counts: LineCounts


def _owned(session: Session, tenant_id: str | None, batch_id: str) -> BatchJob:
    """The batch row, if it is `tenant_id`'s (None: any tenant's, the runner's reads)."""
    row = session.get(BatchJob, batch_id) if well_formed_id(batch_id) else None
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise ResourceNotFoundError(
            f"no batch with id {batch_id[:80]!r}", param="batch_id", code="batch_not_found"
        )
    return row


def new_batch_id() -> str:
    """A fresh, unguessable batch id in OpenAI's spelling."""
    return f"batch_{secrets.token_hex(12)}"


def line_request_id(batch_id: str, line: int) -> str:
    """The fixed request id of a line: its usage record's key, the same on every retry."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


class BatchStore:
    """Batches per tenant; see the module docstring."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def _counts(self, session: Session, batch_ids: list[str]) -> dict[str, LineCounts]:
        if not batch_ids:
            return {}
        rows = session.execute(
            select(
                BatchLineResult.batch_id,
                func.sum(case((BatchLineResult.status_code == 200, 1), else_=0)),
                func.sum(case((BatchLineResult.status_code != 200, 1), else_=0)),
                func.sum(BatchLineResult.prompt_tokens),
                func.sum(BatchLineResult.completion_tokens),
            )
            .where(BatchLineResult.batch_id.in_(batch_ids))
            .group_by(BatchLineResult.batch_id)
        ).all()
        return {
            r[0]: LineCounts(int(r[1] or 0), int(r[2] or 0), int(r[3] or 0), int(r[4] or 0))
            for r in rows
        }

    def _info(self, row: BatchJob, counts: LineCounts) -> BatchInfo:
        return copy_fields(
            BatchInfo,
            row,
            metadata=row.batch_metadata,
            times={name: getattr(row, name) for name in _TIMES},
            counts=counts,
        )

    def create(
        self,
        *,
        tenant_id: str,
        key_id: str,
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        total_lines: int,
        estimated_tokens: int,
        max_queued_tokens: int,
    ) -> BatchInfo:
        """Records a new batch, in progress, if the tenant's unfinished batches and this one
        stay within `max_queued_tokens` (QuotaExceededError otherwise)."""
        now = utcnow()
        with self._sessions.begin() as session:
            queued = session.scalar(
                select(func.coalesce(func.sum(BatchJob.estimated_tokens), 0)).where(
                    BatchJob.tenant_id == tenant_id, BatchJob.status.in_(ACTIVE)
                )
            )
            if int(queued or 0) + estimated_tokens > max_queued_tokens:
                raise QuotaExceededError(
                    f"this batch (about {estimated_tokens} tokens) and the tenant's unfinished"
                    f" batches ({int(queued or 0)}) would pass its batch token budget of"
                    f" {max_queued_tokens}; wait for them to finish",
                    code="batch_token_limit_exceeded",
                )
            row = BatchJob(
                id=new_batch_id(),
                tenant_id=tenant_id,
                key_id=key_id,
                endpoint=endpoint,
                input_file_id=input_file_id,
                completion_window=completion_window,
                status="in_progress",
                total_lines=total_lines,
                estimated_tokens=estimated_tokens,
                batch_metadata=metadata,
                created_at=now,
                in_progress_at=now,
                expires_at=now + COMPLETION_WINDOW,
            )
            session.add(row)
            session.flush()
            return self._info(row, LineCounts())

    def get(self, tenant_id: str | None, batch_id: str) -> BatchInfo:
        """The batch (of `tenant_id`, unless None: the runner's own reads), or not found."""
        with self._sessions() as session:
            row = _owned(session, tenant_id, batch_id)
            return self._info(row, self._counts(session, [row.id]).get(row.id, LineCounts()))

    def page(
        self, tenant_id: str | None, *, limit: int, after: str | None
    ) -> tuple[list[BatchInfo], bool]:
        """A page of batches, newest first (every tenant's when `tenant_id` is None: the
        admin API's view), and whether more follow."""
        with self._sessions() as session:
            query = select(BatchJob)
            if tenant_id is not None:
                query = query.where(BatchJob.tenant_id == tenant_id)
            if well_formed_id(after):
                anchor = session.get(BatchJob, after)
                if anchor is not None and (tenant_id is None or anchor.tenant_id == tenant_id):
                    query = query.where(
                        (BatchJob.created_at < anchor.created_at)
                        | ((BatchJob.created_at == anchor.created_at) & (BatchJob.id < anchor.id))
                    )
            rows = session.scalars(
                query.order_by(BatchJob.created_at.desc(), BatchJob.id.desc()).limit(limit + 1)
            ).all()
            page = rows[:limit]
            counts = self._counts(session, [r.id for r in page])
            return [self._info(r, counts.get(r.id, LineCounts())) for r in page], len(rows) > limit

    def cancel(self, tenant_id: str, batch_id: str) -> BatchInfo:
        """Asks the runner to stop the batch (cancelling; it ends as cancelled). 409 for a
        batch that already ended."""
        with self._sessions.begin() as session:
            row = _owned(session, tenant_id, batch_id)
            if row.status in ENDED or row.status == "finalizing":
                raise BatchStateError(
                    f"the batch is {row.status}: it cannot be cancelled",
                    param="batch_id",
                    code="batch_not_cancellable",
                )
            if row.status != "cancelling":
                row.status = "cancelling"
                row.cancelling_at = utcnow()
        return self.get(tenant_id, batch_id)

    def status_of(self, batch_id: str) -> str | None:
        """The batch's status alone (a cheap read the runner makes before each line)."""
        with self._sessions() as session:
            return session.scalar(select(BatchJob.status).where(BatchJob.id == batch_id))

    def claim(self, batch_id: str, runner_id: str, lease_s: float) -> bool:
        """Takes (or renews) the lease on an active batch for `runner_id`; False when another
        runner holds an unexpired lease on it, or it is no longer active."""
        now = utcnow()
        with self._sessions.begin() as session:
            result = session.execute(
                update(BatchJob)
                .where(
                    BatchJob.id == batch_id,
                    BatchJob.status.in_(ACTIVE),
                    (BatchJob.claimed_by.is_(None))
                    | (BatchJob.claimed_by == runner_id)
                    | (BatchJob.claimed_until < now),
                )
                .values(claimed_by=runner_id, claimed_until=now + dt.timedelta(seconds=lease_s))
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(result, "rowcount", 0) == 1)

    def release(self, batch_ids: list[str], runner_id: str) -> None:
        """Ends `runner_id`'s leases on `batch_ids` (a clean stop)."""
        if not batch_ids:
            return
        with self._sessions.begin() as session:
            session.execute(
                update(BatchJob)
                .where(BatchJob.id.in_(batch_ids), BatchJob.claimed_by == runner_id)
                .values(claimed_by=None, claimed_until=None)
                .execution_options(synchronize_session=False)
            )

    def active_ids(self) -> list[str]:
        """The batches the runner has work on, oldest first."""
        with self._sessions() as session:
            return list(
                session.scalars(
                    select(BatchJob.id)
                    .where(BatchJob.status.in_(ACTIVE))
                    .order_by(BatchJob.created_at, BatchJob.id)
                ).all()
            )

    def done_lines(self, batch_id: str) -> set[int]:
        """The line numbers that have a result."""
        with self._sessions() as session:
            return set(
                session.scalars(
                    select(BatchLineResult.line).where(BatchLineResult.batch_id == batch_id)
                ).all()
            )

    def record(
        self,
        batch_id: str,
        line: int,
        *,
        custom_id: str | None,
        status_code: int,
        record: dict[str, Any],
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> bool:
        """Stores a line's result; False if the line already had one (never twice)."""
        try:
            with self._sessions.begin() as session:
                session.add(
                    BatchLineResult(
                        batch_id=batch_id,
                        line=line,
                        custom_id=custom_id,
                        status_code=status_code,
                        record=record,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens,
                        created_at=utcnow(),
                    )
                )
        except IntegrityError:
            return False
        return True

    def results(self, batch_id: str, *, succeeded: bool) -> Iterator[dict[str, Any]]:
        """The output (`succeeded`) or error lines' records, in input order, in pages."""
        after = -1
        while True:
            with self._sessions() as session:
                ok = BatchLineResult.status_code == 200
                rows = session.execute(
                    select(BatchLineResult.line, BatchLineResult.record)
                    .where(
                        BatchLineResult.batch_id == batch_id,
                        BatchLineResult.line > after,
                        ok if succeeded else ~ok,
                    )
                    .order_by(BatchLineResult.line)
                    .limit(500)
                ).all()
            if not rows:
                return
            for _, record in rows:
                yield record
            after = rows[-1][0]

    def set_status(self, batch_id: str, status: str, **fields: Any) -> None:
        """Moves the batch to `status`, stamping its time (`<status>_at`) and `fields`."""
        with self._sessions.begin() as session:
            row = session.get(BatchJob, batch_id)
            if row is None:
                return
            row.status = status
            stamp = f"{status}_at"
            if stamp in _TIMES and getattr(row, stamp) is None:
                setattr(row, stamp, utcnow())
            for name, value in fields.items():
                setattr(row, name, value)
