"""Audit records and the chain's verification report as the API returns them."""

from __future__ import annotations

from pydantic import BaseModel, JsonValue


class AuditEventPublic(BaseModel):
    """One hash-chained record: who (id and name), what, on what, the outcome, and detail
    (for an update: `before` and `after` of what changed; never a secret)."""

    seq: int
    at: str
    actor: str
    actor_name: str | None = None
    role: str
    tenant_id: str | None
    action: str
    resource: str
    outcome: str
    source_ip: str | None
    request_id: str | None
    detail: dict[str, JsonValue] | None
    prev_hash: str
    hash: str


class AuditVerifyPublic(BaseModel):
    """The outcome of a verification: ok, or the first bad record's seq and why."""

    ok: bool
    records: int
    checkpoints: int
    first_bad_seq: int | None
    reason: str | None
    newest_checkpoint_seq: int | None
    newest_checkpoint_at: str | None
