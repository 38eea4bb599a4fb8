"""Usage buckets (per hour or day) as the API returns them."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel


class UsageBucketPublic(BaseModel):
    """Summed usage of one group in one hour or day; costs in pico-USD."""

    start: str
    tenant_id: str
    key_id: str | None
    model: str
    adapter: str
    status: int  # the HTTP status; refused requests carry zero tokens and cost
    batch: bool  # batch lines (the Batch API), at the batch price; interactive apart
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_pico_usd: int
    unpriced_requests: int
    unpriced: bool  # some of it had no price in force (billed $0)


class UsagePublic(BaseModel):
    """The buckets of a usage query, in time order."""

    items: list[UsageBucketPublic]


class UsageRecordPublic(BaseModel):
    """One request's usage record; `client_request_id` is the caller's x-request-id."""

    request_id: str
    client_request_id: str | None
    occurred_at: dt.datetime
    tenant_id: str
    key_id: str | None
    model: str
    adapter: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_pico_usd: int
    status: int
    finish_reason: str | None
    client_disconnected: bool
    batch: bool  # a line of a batch (the Batch API), billed at the batch price
