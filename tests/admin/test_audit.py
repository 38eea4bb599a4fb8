"""Audit tampering on 10,000 events: each kind detected with the first bad record named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from admin.audit_chain import (
    GENESIS,
    checkpoint_digest,
    load_private_key,
    make_checkpoint,
    make_manifest,
    parse_export,
    public_hex,
    seal,
    verify,
)
from admin.audit_log import AuditLog
from tests.utils.admin_db import migrated_sessions, record_tenant_create
from tests.utils.admin_env import SIGNING_SEED

N = 10_000
EVERY = 500
KEY = load_private_key(SIGNING_SEED)
PUB = public_hex(KEY)


def _build() -> list[str]:
    """An export of N records with a checkpoint every EVERY records."""
    records, cps = [], []
    prev, digest = GENESIS, GENESIS
    for seq in range(1, N + 1):
        fields = {
            "at": f"2026-11-29T10:{seq % 60:02d}:00+00:00",
            "actor": f"token:adm_{seq % 7}",
            "role": "admin",
            "tenant_id": f"ten_{seq % 13}",
            "action": "key.create",
            "resource": f"tenants/t{seq}/keys",
            "outcome": "success",
            "source_ip": "10.0.0.1",
            "request_id": f"req-{seq}",
            "detail": None,
        }
        rec = seal(fields, seq=seq, prev_hash=prev)
        prev = rec["hash"]
        records.append(rec)
        if seq % EVERY == 0:
            cp = make_checkpoint(KEY, seq=seq, record_hash=prev, prev_digest=digest, created_at="t")
            digest = checkpoint_digest(cp)
            cps.append(cp)
    lines = [json.dumps({"type": "manifest", **make_manifest(KEY, records, cps)})]
    by_seq = {c["seq"]: c for c in cps}
    for r in records:
        lines.append(json.dumps({"type": "record", **r}, separators=(",", ":")))
        if r["seq"] in by_seq:
            lines.append(json.dumps({"type": "checkpoint", **by_seq[r["seq"]]}))
    return lines


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return _build()


def _check(lines: list[str]) -> tuple[bool, int | None, str | None]:
    manifest, records, cps = parse_export("\n".join(lines))
    report = verify(records, cps, public_key=PUB, interval=EVERY, manifest=manifest)
    return report.ok, report.first_bad_seq, report.reason


def _index_of(lines: list[str], seq: int) -> int:
    return next(
        i
        for i, ln in enumerate(lines)
        if ln.startswith('{"type":"record"') and f'"seq":{seq},' in ln
    )


def test_untouched_log_verifies(lines: list[str]) -> None:
    assert _check(lines) == (True, None, None)


@pytest.mark.parametrize("seq", [1, 777, 5000, N])
def test_changing_one_byte_is_named(lines: list[str], seq: int) -> None:
    for field in ("actor", "outcome", "request_id"):
        i = _index_of(lines, seq)
        line = lines[i]
        at = line.index(f'"{field}":"') + len(field) + 4
        tampered = line[:at] + ("X" if line[at] != "X" else "Y") + line[at + 1 :]
        ok, bad, _ = _check([*lines[:i], tampered, *lines[i + 1 :]])
        assert (ok, bad) == (False, seq), field


def test_changing_a_hash_byte_is_named(lines: list[str]) -> None:
    i = _index_of(lines, 4321)
    line = lines[i]
    at = line.index('"hash":"') + 8
    tampered = line[:at] + ("0" if line[at] != "0" else "1") + line[at + 1 :]
    assert _check([*lines[:i], tampered, *lines[i + 1 :]])[:2] == (False, 4321)


def test_deleting_one_record_is_named(lines: list[str]) -> None:
    i = _index_of(lines, 6001)
    assert _check(lines[:i] + lines[i + 1 :])[:2] == (False, 6001)


def test_swapping_two_records_is_named(lines: list[str]) -> None:
    i, j = _index_of(lines, 1234), _index_of(lines, 8765)
    swapped = list(lines)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    assert _check(swapped)[:2] == (False, 1234)


@pytest.mark.parametrize("keep", [N - 1, N - 300, 9_000])
def test_truncating_the_tail_is_named(lines: list[str], keep: int) -> None:
    cut = _index_of(lines, keep + 1)
    ok, bad, reason = _check(lines[:cut])
    assert (ok, bad) == (False, keep + 1)
    assert reason and "truncated" in reason


@pytest.mark.parametrize("cp_seq", [EVERY, 3_000, N])
def test_removing_a_checkpoint_is_detected(lines: list[str], cp_seq: int) -> None:
    i = next(
        k
        for k, ln in enumerate(lines)
        if ln.startswith('{"type": "checkpoint"') and f'"seq": {cp_seq},' in ln
    )
    ok, bad, _ = _check(lines[:i] + lines[i + 1 :])
    assert (ok, bad) == (False, cp_seq - EVERY + 1)


def test_a_forged_signature_is_refused(lines: list[str]) -> None:
    other = load_private_key("77" * 32)
    manifest, records, cps = parse_export("\n".join(lines))
    assert verify(records, cps, public_key=public_hex(other), interval=EVERY).ok is False


def test_database_log_verifies_and_exports(tmp_path: Path) -> None:
    sessions = migrated_sessions(tmp_path / "a.db")
    log = AuditLog(sessions, signing_key=KEY, checkpoint_every=10)
    for i in range(35):
        record_tenant_create(log, i, detail={"name": f"t{i}", "secret": "sk-clo-hidden"})
    assert log.verify(public_key=PUB).ok
    export = log.export_jsonl()
    assert "sk-clo-hidden" not in export
    manifest, records, cps = parse_export(export)
    assert [c["seq"] for c in cps] == [10, 20, 30]
    assert verify(records, cps, public_key=PUB, interval=10, manifest=manifest).ok
    # Edit one stored row behind the log's back: verify names it.
    with sessions() as s:
        from admin.models import AuditEvent

        row = s.get(AuditEvent, 17)
        assert row is not None
        row.outcome = "denied:403"
        s.commit()
    report = log.verify(public_key=PUB)
    assert (report.ok, report.first_bad_seq) == (False, 17)
