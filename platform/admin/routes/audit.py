"""The audit log: list, search, export (signed JSON lines) and verify the chain."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse
from sqlalchemy import select

from admin.audit_chain import load_private_key, public_hex
from admin.audit_log import event_dict
from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, allow
from admin.models import AuditEvent
from admin.roles import AUDIT_READ
from admin.schemas.audit import AuditEventPublic, AuditVerifyPublic
from admin.schemas.common import Page
from admin.serialize import Limit, Offset, page
from server.field_copy import copy_fields

router = APIRouter(
    prefix="/audit",
    tags=["audit"],
    route_class=CappedJsonRoute,
    dependencies=[allow(AUDIT_READ)],
)


def _public(row: AuditEvent) -> AuditEventPublic:
    return AuditEventPublic.model_validate(event_dict(row))


def _iso_utc(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise HTTPException(400, "times need a time zone")
    # Audit times are stored as ISO text in UTC, so text order is time order.
    return value.astimezone(dt.UTC).isoformat(timespec="microseconds")


@router.get("")
def audit_events(
    ctx: Ctx,
    limit: Limit = 100,
    offset: Offset = 0,
    action: str | None = None,
    outcome: str | None = None,
) -> Page[AuditEventPublic]:
    """Audit records, newest first."""
    ctx.services.audit_writer.flush()  # what was queued before this call is in the answer
    query = select(AuditEvent).order_by(AuditEvent.seq.desc())
    if action:
        query = query.where(AuditEvent.action == action)
    if outcome:
        query = query.where(AuditEvent.outcome == outcome)
    return page(ctx.session, query, limit, offset, _public)


@router.get("/search")
def search_audit(
    ctx: Ctx,
    limit: Limit = 100,
    offset: Offset = 0,
    actor: str | None = None,
    tenant_id: str | None = None,
    action: str | None = None,
    outcome: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> Page[AuditEventPublic]:
    """Audit records, newest first, filtered by actor (id or name), tenant, action
    (prefix), outcome (prefix) and time."""
    ctx.services.audit_writer.flush()
    e = AuditEvent
    query = select(e).order_by(e.seq.desc())
    if actor:
        query = query.where(e.actor.contains(actor) | e.actor_name.contains(actor))
    if tenant_id:
        query = query.where(e.tenant_id == tenant_id)
    if action:
        query = query.where(e.action.startswith(action))
    if outcome:
        query = query.where(e.outcome.startswith(outcome))
    start, end = _iso_utc(since), _iso_utc(until)
    if start:
        query = query.where(e.at >= start)
    if end:
        query = query.where(e.at < end)
    return page(ctx.session, query, limit, offset, _public)


@router.get(
    "/export",
    response_class=PlainTextResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
def audit_export(ctx: Ctx) -> PlainTextResponse:
    """The whole log as JSON lines with its signed manifest and checkpoints."""
    ctx.audit("audit.export", "audit")
    ctx.services.audit_writer.flush()
    try:
        text = ctx.services.audit.export_jsonl()
    except RuntimeError as exc:
        raise HTTPException(409, str(exc)) from exc
    return PlainTextResponse(text, media_type="application/x-ndjson")


@router.get("/verify")
def audit_verify(ctx: Ctx) -> AuditVerifyPublic:
    """Verifies the stored chain and checkpoints."""
    key = ctx.services.settings.audit_signing_key
    if key is None:
        raise HTTPException(409, "no audit signing key configured")
    ctx.services.audit_writer.flush()
    report = ctx.services.audit.verify(
        public_key=public_hex(load_private_key(key.get_secret_value()))
    )
    return copy_fields(AuditVerifyPublic, report)
