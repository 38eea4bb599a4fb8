"""`cloister audit verify --file`: an auditor checks an export offline, and tampering names its line."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from admin.audit_chain import load_private_key, public_hex
from admin.audit_file import verify_export
from admin.audit_log import AuditLog
from cloister.commands import audit as audit_cmd
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.admin_env import SIGNING_SEED

EVERY = 4
KEY = load_private_key(SIGNING_SEED)
PUB = public_hex(KEY)
# Somewhere no database is: the offline check must never try to reach one.
NO_DATABASE = {
    "CLOISTER_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/none",
    "CLOISTER_ADMIN_AUDIT_SIGNING_KEY": None,
}


@pytest.fixture(scope="module")
def export_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A real export of 10 records (checkpoints at 4 and 8 and the head) made by AuditLog."""
    tmp = tmp_path_factory.mktemp("audit")
    url = f"sqlite:///{tmp / 'audit.db'}"
    upgrade_database(url)
    log = AuditLog(make_session_factory(make_engine(url)), signing_key=KEY, checkpoint_every=EVERY)
    for i in range(10):
        log.record(
            actor=f"token:adm_{i % 3}",
            role="admin",
            action="tenant.create",
            resource=f"tenants/t{i}",
            outcome="success",
            tenant_id=f"ten_{i}",
            detail={"name": f"t{i}", "weight": i / 2},
        )
    log.checkpoint()
    return log.export_jsonl().splitlines()


@pytest.fixture
def cli() -> click.Group:
    group = click.Group()
    for command in audit_cmd.commands:
        group.add_command(command)
    return group


def _line_of(lines: list[str], kind: str, seq: int) -> int:
    """The 1-based line of the record (or checkpoint) `seq`."""
    for n, line in enumerate(lines, 1):
        item = json.loads(line)
        if item["type"] == kind and item["seq"] == seq:
            return n
    raise AssertionError(f"no {kind} {seq}")


def _run(cli: click.Group, lines: list[str], *args: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "export.jsonl"
        path.write_text("\n".join(lines) + "\n")
        here = os.getcwd()
        os.chdir(tmp)  # a default data dir (./var) would be created here
        try:
            out = CliRunner().invoke(
                cli, ["audit", "verify", "--file", str(path), *args], env=NO_DATABASE
            )
        finally:
            os.chdir(here)
        left = sorted(os.listdir(tmp))
    assert left == ["export.jsonl"]  # nothing written beside it (no data dir, no secrets)
    return out.exit_code, out.output


def test_an_export_verifies_offline(cli: click.Group, export_lines: list[str]) -> None:
    code, out = _run(cli, export_lines)
    assert code == 0, out
    assert out.startswith("ok: 10 records, 3 checkpoints")
    assert "signed by the key in its manifest" in out and PUB in out
    code, out = _run(cli, export_lines, "--public-key", PUB, "--checkpoint-every", str(EVERY))
    assert code == 0 and f"signed by {PUB}" in out
    other = public_hex(load_private_key("11" * 32))
    code, out = _run(cli, export_lines, "--public-key", other)
    assert code == 1 and out.count("\n") == 1
    assert re.match(rf"FAILED at line {_line_of(export_lines, 'checkpoint', 4)}\b", out)


def _record_6_edited(lines: list[str], edit: Callable[[dict[str, Any]], None]) -> list[str]:
    """The export with record 6 parsed, changed in place by `edit` and written back."""
    out = list(lines)
    n = _line_of(lines, "record", 6) - 1
    item = json.loads(out[n])
    edit(item)
    out[n] = json.dumps(item, separators=(",", ":"))
    return out


def _changed_field(lines: list[str]) -> list[str]:
    return _record_6_edited(lines, lambda item: item.update(actor="token:adm_someone_else"))


def _changed_detail(lines: list[str]) -> list[str]:
    return _record_6_edited(lines, lambda item: item["detail"].update(weight=99))


def _deleted(lines: list[str]) -> list[str]:
    out = list(lines)
    del out[_line_of(lines, "record", 6) - 1]
    return out


def _reordered(lines: list[str]) -> list[str]:
    out = list(lines)
    a, b = _line_of(lines, "record", 6) - 1, _line_of(lines, "record", 7) - 1
    out[a], out[b] = out[b], out[a]
    return out


def _checkpoint_deleted(lines: list[str]) -> list[str]:
    out = list(lines)
    del out[_line_of(lines, "checkpoint", 4) - 1]
    return out


def _truncated(lines: list[str]) -> list[str]:
    return lines[: _line_of(lines, "record", 9)]


def _not_json(lines: list[str]) -> list[str]:
    out = list(lines)
    out[_line_of(lines, "record", 6) - 1] = out[_line_of(lines, "record", 6) - 1][:-5]
    return out


# (tampering, the line named, in the untouched file's numbering, and words of the reason)
CASES: list[tuple[Callable[[list[str]], list[str]], tuple[str, int], str]] = [
    (_changed_field, ("record", 6), "record content altered"),
    (_changed_detail, ("record", 6), "record content altered"),
    (_deleted, ("record", 7), "expected record 6, found 7"),
    (_reordered, ("record", 6), "expected record 6, found 7"),
    (_not_json, ("record", 6), "not JSON"),
]


@pytest.mark.parametrize(
    ("tamper", "where", "why"), CASES, ids=lambda c: getattr(c, "__name__", "")
)
def test_a_tampered_line_fails_with_one_line_naming_it(
    cli: click.Group,
    export_lines: list[str],
    tamper: Callable[[list[str]], list[str]],
    where: tuple[str, int],
    why: str,
) -> None:
    tampered = tamper(export_lines)
    code, out = _run(cli, tampered)
    assert code == 1
    assert out.count("\n") == 1, out  # one line
    line = _line_of(export_lines, *where)
    if tamper is _deleted:
        line -= 1  # record 7 moved up into the deleted line's place
    if tamper is _reordered:
        line = _line_of(export_lines, "record", 6)  # where record 7 now stands
    assert re.match(rf"FAILED at line {line}\b", out), out
    assert why in out


def test_a_removed_checkpoint_or_a_cut_tail_is_named_too(export_lines: list[str]) -> None:
    cut = verify_export("\n".join(_checkpoint_deleted(export_lines)), public_key=PUB)
    assert not cut.ok and "checkpoint before record 8 was removed" in cut.message
    assert cut.line is not None
    assert '"type": "checkpoint"' in _checkpoint_deleted(export_lines)[cut.line - 1]
    tail = verify_export("\n".join(_truncated(export_lines)), public_key=PUB)
    assert not tail.ok and "missing (log truncated)" in (tail.report.reason if tail.report else "")
    empty = verify_export("", public_key=PUB)
    assert not empty.ok and empty.message == "FAILED at line 1: no signed manifest line"
