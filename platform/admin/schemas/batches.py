"""A tenant's batches and their progress, as GET /tenants/{name}/batches returns them."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel


class BatchProgress(BaseModel):
    """One batch: where it stands and what its finished lines consumed."""

    id: str
    status: str
    endpoint: str
    input_file_id: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: dt.datetime
    expires_at: dt.datetime
    ended_at: dt.datetime | None  # completed, failed, expired or cancelled
    total_lines: int
    completed_lines: int  # answered 200
    failed_lines: int  # malformed, or answered with an error
    prompt_tokens: int
    completion_tokens: int
    estimated_tokens: int  # what the batch holds of the tenant's batch token budget


class TenantBatches(BaseModel):
    """A page of the tenant's batches, newest first."""

    tenant: str
    items: list[BatchProgress]
    has_more: bool
