"""Signed checkpoints below the 1,000-record interval: at shutdown, every T seconds, and a
copy outside the database; `audit verify` catches tail truncation and rewritten chains and
says how old the newest checkpoint is (issue 13, defect 13)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from admin.audit_chain import GENESIS, load_private_key, public_hex, record_hash
from admin.audit_log import AuditLog, event_dict
from admin.models import AuditCheckpoint, AuditEvent
from admin.settings import AdminSettings
from cloister.commands import admin as admin_cmd
from cloister.commands import audit as audit_cmd
from server.settings import Settings
from tenancy.db import make_engine, make_session_factory
from tests.utils.admin_db import migrated_postgres, migrated_sessions, record_tenant_create
from tests.utils.admin_env import SIGNING_SEED

KEY = load_private_key(SIGNING_SEED)
PUB = public_hex(KEY)
N = 50


def database(tmp_path: Path) -> sessionmaker[Session]:
    return migrated_sessions(tmp_path / "audit.db")


def fill(log: AuditLog, n: int = N) -> None:
    for i in range(n):
        record_tenant_create(log, i)


@pytest.fixture
def logged(tmp_path: Path) -> tuple[sessionmaker[Session], AuditLog]:
    """50 records (fewer than the 1,000-record interval), then a shutdown."""
    sessions = database(tmp_path)
    log = AuditLog(
        sessions, signing_key=KEY, checkpoint_every=1000, head_path=tmp_path / "head.json"
    )
    fill(log)
    log.close()  # the shutdown checkpoint
    return sessions, AuditLog(
        sessions, signing_key=KEY, checkpoint_every=1000, head_path=tmp_path / "head.json"
    )


def truncate(sessions: sessionmaker[Session], keep: int, *, checkpoints: bool) -> None:
    with sessions() as s:
        s.execute(delete(AuditEvent).where(AuditEvent.seq > keep))
        if checkpoints:  # an attacker who also removes the checkpoints over the tail
            s.execute(delete(AuditCheckpoint).where(AuditCheckpoint.seq > keep))
        s.commit()


def test_a_clean_log_verifies_with_its_newest_checkpoint(
    logged: tuple[sessionmaker[Session], AuditLog],
) -> None:
    _, log = logged
    report = log.verify(public_key=PUB)
    assert report.ok, report.reason
    assert (report.newest_checkpoint_seq, report.unsigned) == (N, 0)
    assert report.newest_checkpoint_at is not None


@pytest.mark.parametrize("checkpoints", [False, True], ids=["records", "records+checkpoints"])
def test_truncating_the_last_20_records_fails(
    logged: tuple[sessionmaker[Session], AuditLog], checkpoints: bool
) -> None:
    sessions, log = logged
    truncate(sessions, N - 20, checkpoints=checkpoints)
    report = log.verify(public_key=PUB)
    assert not report.ok
    assert report.first_bad_seq == N - 20 + 1, report.reason
    assert "truncated" in (report.reason or "")


def test_rewriting_a_record_and_recomputing_the_chain_fails(
    logged: tuple[sessionmaker[Session], AuditLog],
) -> None:
    sessions, log = logged
    with sessions() as s:
        prev = GENESIS
        for row in s.query(AuditEvent).order_by(AuditEvent.seq):
            if row.seq == 10:
                row.outcome = "denied:403"
            row.prev_hash = prev
            row.hash = record_hash(event_dict(row))
            prev = row.hash
        s.commit()
    report = log.verify(public_key=PUB)
    assert not report.ok
    assert "differ from the signed checkpoint" in (report.reason or "")


def test_the_timer_signs_the_head_without_a_shutdown(tmp_path: Path) -> None:
    sessions = database(tmp_path)
    log = AuditLog(sessions, signing_key=KEY, checkpoint_every=1000, checkpoint_interval_s=0.05)
    log.start()
    try:
        fill(log, 3)
        deadline = time.monotonic() + 30
        while log.verify(public_key=PUB).newest_checkpoint_seq != 3:
            assert time.monotonic() < deadline, "no timed checkpoint"
            time.sleep(0.02)
    finally:
        log.close()


def test_a_late_signer_still_signs_every_periodic_checkpoint(tmp_path: Path) -> None:
    # Another process appended past a multiple of N without signing it.
    sessions = database(tmp_path)
    fill(AuditLog(sessions, signing_key=None, checkpoint_every=10), 25)
    log = AuditLog(sessions, signing_key=KEY, checkpoint_every=10)
    log.checkpoint()
    _, cps = log.load()
    assert [c["seq"] for c in cps] == [10, 20, 25]
    assert log.verify(public_key=PUB).ok


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> click.Group:
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_KEY_PEPPER", "audit-cli-pepper")
    monkeypatch.setenv("CLOISTER_ADMIN_AUDIT_SIGNING_KEY", SIGNING_SEED)
    group = click.Group()
    for module in (admin_cmd, audit_cmd):
        for command in module.commands:
            group.add_command(command)
    return group


def test_cli_verify_reports_age_then_catches_truncation(cli: click.Group) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["audit", "verify"]).exit_code == 0  # migrates
    settings = Settings()
    from admin.app import make_services

    services = make_services(
        make_session_factory(make_engine(settings.resolved_database_url)),
        pepper=settings.key_pepper.get_secret_value(),
        settings=AdminSettings.from_settings(settings),
    )
    fill(services.audit, 30)
    services.audit.close()
    ok = runner.invoke(cli, ["audit", "verify"])
    assert ok.exit_code == 0, ok.output
    assert "newest signed checkpoint at record 30, signed " in ok.output
    assert " s ago " in ok.output and "nothing after it is unsigned" in ok.output
    fill(services.audit, 2)  # not signed yet: said so
    assert "2 records after it not yet signed" in runner.invoke(cli, ["audit", "verify"]).output
    head = AdminSettings.from_settings(settings).audit_head_path
    assert head is not None and json.loads(head.read_text())["seq"] == 30
    assert oct(head.stat().st_mode & 0o777) == "0o600"
    truncate(services.sessions, 10, checkpoints=True)
    failed = runner.invoke(cli, ["audit", "verify"])
    assert failed.exit_code == 1
    assert "FAILED at record 11" in failed.output and "truncated" in failed.output


@pytest.mark.services
def test_concurrent_signers_on_postgresql_keep_one_chain(tmp_path: Path) -> None:
    import threading

    with migrated_postgres() as (_, sessions):
        # Two processes' logs (two signers), each with its own timer.
        logs = [
            AuditLog(sessions, signing_key=KEY, checkpoint_every=7, checkpoint_interval_s=0.01)
            for _ in range(2)
        ]
        for log in logs:
            log.start()
        writers = [threading.Thread(target=fill, args=(log, 40)) for log in logs]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        for log in logs:
            log.close()
        report = logs[0].verify(public_key=PUB)
        assert report.ok, report.reason
        assert (report.records, report.unsigned) == (80, 0)
