"""Closing the audit writer twice, as `cloister serve`'s two shutdown hooks do.

The second close used to hand a flush marker to the thread the first close had
stopped, and wait its whole 10 s timeout for it: every SIGTERM of `cloister serve`
took 10 s longer than it needed.
"""

from __future__ import annotations

import time
from pathlib import Path

from admin.audit_chain import load_private_key
from admin.audit_log import AuditLog
from admin.audit_writer import AuditWriter
from admin.models import AuditEvent
from tests.utils.admin_db import migrated_sessions, record_tenant_create
from tests.utils.admin_env import SIGNING_SEED


def _record(writer: AuditWriter, i: int) -> None:
    record_tenant_create(writer, i, outcome="ok")


def test_a_second_close_writes_what_came_since_without_waiting(tmp_path: Path) -> None:
    sessions = migrated_sessions(tmp_path / "audit.db")
    writer = AuditWriter(AuditLog(sessions, signing_key=load_private_key(SIGNING_SEED)))
    _record(writer, 0)
    writer.close()
    _record(writer, 1)  # a late record: its thread is gone, so the next close writes it
    start = time.monotonic()
    writer.close()
    assert time.monotonic() - start < 5.0  # it waited 10 s for the stopped thread
    assert writer.flush(timeout_s=10.0)
    with sessions() as s:
        resources = [e.resource for e in s.query(AuditEvent).order_by(AuditEvent.seq)]
    assert resources == ["tenants/t0", "tenants/t1"]
