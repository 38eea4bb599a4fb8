"""`cloister admin create-token`, `cloister billing export` and `cloister audit verify|export`."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cloister.commands import admin as admin_cmd
from cloister.commands import audit as audit_cmd
from cloister.commands import billing as billing_cmd
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import SIGNING_SEED


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> click.Group:
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_ADMIN_AUDIT_SIGNING_KEY", SIGNING_SEED)
    monkeypatch.setenv("CLOISTER_ADMIN_AUDIT_CHECKPOINT_EVERY", "3")
    group = click.Group()
    for module in (admin_cmd, audit_cmd, billing_cmd):
        for command in module.commands:
            group.add_command(command)
    return group


def test_create_token_json_then_audit_round_trip(cli: click.Group, tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["admin", "create-token", "--role", "admin", "--json"])
    assert out.exit_code == 0, out.output
    token = json.loads(out.output)["token"]
    assert token.startswith("clo-adm-")
    bad = runner.invoke(cli, ["admin", "create-token", "--role", "tenant-admin"])
    assert bad.exit_code != 0
    # Some audited actions through the API, then verify from the CLI.
    from server.settings import Settings
    from tests.utils.admin_app import admin_app_from_settings

    services, client = admin_app_from_settings(Settings())
    for i in range(7):
        r = client.post(
            "/admin/api/v1/tenants",
            json={"name": f"t{i}"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 201
    services.audit_writer.flush()  # the API queues its records; the CLI reads the database
    ok = runner.invoke(cli, ["audit", "verify"])
    # The CLI's create-token is audited too: 1 + 7 records.
    assert ok.exit_code == 0 and "ok: 8 records, 2 checkpoints" in ok.output
    export = tmp_path / "audit.jsonl"
    assert runner.invoke(cli, ["audit", "export", "--output", str(export)]).exit_code == 0
    assert runner.invoke(cli, ["audit", "verify", "--export", str(export)]).exit_code == 0
    lines = export.read_text().splitlines()
    del lines[5]
    export.write_text("\n".join(lines) + "\n")
    failed = runner.invoke(cli, ["audit", "verify", "--export", str(export)])
    assert failed.exit_code == 1 and failed.output.startswith("FAILED at line 6 (record 5): ")


def test_billing_export_command(cli: click.Group) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["billing", "export", "--period", "2026-11", "--format", "csv"])
    assert out.exit_code == 0, out.output
    header, period = out.output.splitlines()[:2]
    assert header.startswith("record,period,period_start,period_end,section,tenant_name,tenant_id")
    assert header.endswith(",requests,input_tokens,cached_input_tokens,output_tokens,total_usd")
    assert period.startswith("period,2026-11,2026-11-01T00:00:00+00:00,2026-12-01T00:00:00+00:00")
    assert runner.invoke(cli, ["billing", "export", "--period", "nope"]).exit_code != 0


def test_billing_export_command_marks_unpriced_usage(cli: click.Group) -> None:
    import datetime as dt

    from admin.usage_store import write_usage
    from server.settings import Settings
    from tenancy.db import make_engine, make_session_factory, upgrade_database

    url = Settings().resolved_database_url
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    when = dt.datetime(2026, 11, 3, 10, tzinfo=dt.UTC)
    with sessions() as s:
        register_stand_in(s, "nopri")
        row = {
            "request_id": "r1",
            "occurred_at": when.isoformat(),
            "tenant_id": "ten_1",
            "key_id": "k",
            "model": "nopri",
            "prompt_tokens": 5,
            "cached_tokens": 0,
            "completion_tokens": 3,
            "latency_s": 0.1,
            "status": 200,
        }
        assert write_usage(s, [row]) == 1
    out = CliRunner().invoke(cli, ["billing", "export", "--period", "2026-11", "--format", "jsonl"])
    assert out.exit_code == 0, out.output
    records = [json.loads(x) for x in out.output.splitlines()]
    (line,) = [r for r in records if r["record"] == "line"]
    assert line["model"] == "nopri" and line["section"] == "unpriced"
    assert line["total_usd"] == "0.000000000000" and line["input_usd_per_1m"] is None
    assert (line["input_tokens"], line["output_tokens"]) == (5, 3)


@pytest.mark.parametrize("role", ["operator", "finance", "auditor"])
def test_create_token_accepts_the_new_roles(cli: click.Group, role: str) -> None:
    out = CliRunner().invoke(cli, ["admin", "create-token", "--role", role, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["token"].startswith("clo-adm-")
