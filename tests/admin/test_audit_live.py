"""`cloister audit verify` after a real `cloister serve` stopped: its shutdown checkpoint
catches a rewritten-and-rechained record and a truncated tail, far below the 1,000-record
interval, and says how old the newest signed checkpoint is (issue 13, defect 13)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from admin.audit_chain import GENESIS, record_hash
from admin.audit_log import event_dict
from admin.identity import create_admin_token
from admin.models import AuditEvent
from cloister.commands import audit as audit_cmd
from tests.gateway.processes import database, spawn_gateway, stop, wait_ready
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow
WRITES = 25


def verify(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    """`cloister audit verify` on the server's data directory (same settings as serve)."""
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(data_dir))
    monkeypatch.setenv("CLOISTER_KEY_PEPPER", PEPPER)
    group = click.Group()
    for command in audit_cmd.commands:
        group.add_command(command)
    return CliRunner().invoke(group, ["audit", "verify"])


def rechain(sessions: sessionmaker[Session], seq: int, outcome: str) -> dict[int, Any]:
    """Rewrites record `seq` and recomputes every hash after it; returns the old rows."""
    saved: dict[int, Any] = {}
    with sessions() as s:
        prev = GENESIS
        for row in s.query(AuditEvent).order_by(AuditEvent.seq):
            saved[row.seq] = (row.outcome, row.prev_hash, row.hash)
            if row.seq == seq:
                row.outcome = outcome
            row.prev_hash = prev
            row.hash = record_hash(event_dict(row))
            prev = row.hash
        s.commit()
    return saved


def restore(sessions: sessionmaker[Session], saved: dict[int, Any]) -> None:
    with sessions() as s:
        for row in s.query(AuditEvent):
            row.outcome, row.prev_hash, row.hash = saved[row.seq]
        s.commit()


def test_verify_after_a_served_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "data"
    sessions = database(data_dir)
    with sessions() as s:
        token = create_admin_token(s, pepper=PEPPER, role="admin").secret
    gw = spawn_gateway(data_dir, make_tiny_model_dir(tmp_path), tmp_path / "serve.log")
    try:
        wait_ready(gw)
        for i in range(WRITES):
            r = httpx.post(
                gw.base_url + "/admin/api/v1/tenants",
                json={"name": f"t{i}"},
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            assert r.status_code == 201, r.text
    finally:
        stop(gw)  # SIGTERM: a clean shutdown signs the head
    # uvicorn raises SIGTERM again once the app has shut down.
    assert gw.proc.returncode in (0, -signal.SIGTERM), gw.logs()
    with sessions() as s:
        records = s.query(AuditEvent).count()
    assert records >= WRITES

    clean = verify(data_dir, monkeypatch)
    assert clean.exit_code == 0, clean.output

    saved = rechain(sessions, 3, "denied:403")
    rewritten = verify(data_dir, monkeypatch)
    assert rewritten.exit_code == 1, rewritten.output
    assert "differ from the signed checkpoint" in rewritten.output
    restore(sessions, saved)
    assert verify(data_dir, monkeypatch).exit_code == 0

    with sessions() as s:
        s.execute(delete(AuditEvent).where(AuditEvent.seq > records - 20))
        s.commit()
    truncated = verify(data_dir, monkeypatch)
    assert truncated.exit_code == 1, truncated.output
    assert f"FAILED at record {records - 20 + 1}" in truncated.output
    assert "truncated" in truncated.output

    assert f"newest signed checkpoint at record {records}, signed " in clean.output
    assert "nothing after it is unsigned" in clean.output
