"""A record the database can never take does not hold up the audit log behind it.

The writer retried every failed write until it succeeded, to keep the order while the
database was down. But a record with a field longer than its column (an address of 65
characters or more: a client on a trusted proxy hop can put anything in
X-Forwarded-For) fails on PostgreSQL every time, so every later record waited behind
it until the queue overflowed and records were dropped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from admin.audit_chain import load_private_key, public_hex
from admin.audit_log import AuditLog
from admin.audit_writer import AuditWriter
from admin.models import AuditEvent
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.admin_env import SIGNING_SEED
from tests.utils.services import postgres_database

LONG = "203.0.113." + "9" * 200


def _events(url: str) -> list[AuditEvent]:
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        return list(s.scalars(sa.select(AuditEvent).order_by(AuditEvent.seq)))


def test_an_overlong_source_address_is_cut_to_its_column_and_the_log_goes_on() -> None:
    with postgres_database() as url:
        upgrade_database(url)
        key = load_private_key(SIGNING_SEED)
        log = AuditLog(make_session_factory(make_engine(url)), signing_key=key)
        writer = AuditWriter(log, denial_window_s=0.05)
        try:
            writer.denied(
                source=LONG,
                actor="anonymous",
                role="none",
                tenant_id=None,
                outcome="denied:401",
                resource="/admin/api/v1/tenants",
                reason="invalid",
                action="tenants.list",
            )
            writer.record(
                actor="token:adm_1",
                role="admin" * 20,  # longer than its column too
                action="tenant.create",
                resource="tenants/after",
                outcome="ok",
                source_ip=LONG,
            )
            assert writer.flush(timeout_s=10.0)
        finally:
            writer.close()
        events = _events(url)
        # The denial is written when its window closes, after the record.
        assert [e.resource for e in events] == ["tenants/after", "/admin/api/v1/tenants"]
        assert all(e.source_ip == LONG[:64] for e in events)
        assert events[0].role == ("admin" * 20)[:32]
        assert log.verify(public_key=public_hex(key)).ok  # cut before hashing: the chain holds


class _Refuses(AuditLog):
    """A log whose database refuses one record for good (as a constraint would)."""

    def record(self, **fields: Any) -> dict[str, Any]:
        if fields["resource"] == "tenants/poison" and fields["action"] == "tenant.create":
            raise sa.exc.DataError("INSERT", {}, Exception("value too long"))
        return super().record(**fields)


def test_a_record_the_database_never_takes_is_replaced_by_a_note_of_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade_database(url)
    writer = AuditWriter(_Refuses(make_session_factory(make_engine(url)), signing_key=None))
    try:
        for resource in ("tenants/a", "tenants/poison", "tenants/b"):
            writer.record(
                actor="token:adm_1",
                role="admin",
                action="tenant.create",
                resource=resource,
                outcome="ok",
            )
        start = time.monotonic()
        assert writer.flush(timeout_s=10.0)
        assert time.monotonic() - start < 2.0  # no retry of what can never be written
    finally:
        writer.close()
    events = _events(url)
    assert [(e.action, e.resource) for e in events] == [
        ("tenant.create", "tenants/a"),
        ("audit.unwritable", "tenants/poison"),
        ("tenant.create", "tenants/b"),
    ]
    assert events[1].outcome == "error"
    assert events[1].detail == {
        "action": "tenant.create",
        "actor": "token:adm_1",
        "error": "DataError",
    }
