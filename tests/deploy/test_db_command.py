"""`cloister db upgrade` and `cloister db wait`: the migration Job's and the gateways'
init container's commands, on a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cloister.cli import main
from cloister.cli_db import redact_url
from cloister.commands.db import head_revision, one_line


def test_upgrade_migrates_and_reports_the_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    runner = CliRunner()
    before = runner.invoke(main, ["db", "wait", "--database-url", url, "--timeout-s", "0"])
    assert before.exit_code == 1 and "waiting for" in before.output
    result = runner.invoke(main, ["db", "upgrade", "--database-url", url, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"database": url, "revision": head_revision(url)}
    again = runner.invoke(main, ["db", "upgrade", "--database-url", url, "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["revision"] == head_revision(url)
    after = runner.invoke(main, ["db", "wait", "--database-url", url, "--json"])
    assert after.exit_code == 0 and json.loads(after.output)["revision"] == head_revision(url)


def test_failure_is_one_line_without_the_password() -> None:
    url = "postgresql+psycopg://u:hunter2-secret@127.0.0.1:1/x"
    result = CliRunner().invoke(main, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 1
    assert "hunter2" not in result.output
    assert result.output.startswith(
        "error: upgrade of postgresql+psycopg://u:***@127.0.0.1:1/x failed"
    )
    assert len(result.output.strip().splitlines()) == 1


def test_settings_refusal_is_a_cli_error(monkeypatch: object) -> None:
    env = {"CLOISTER_ENVIRONMENT": "production", "CLOISTER_KEY_PEPPER": ""}
    result = CliRunner(env=env).invoke(main, ["db", "upgrade"])
    assert result.exit_code == 1
    assert result.output.startswith("error: invalid settings:")
    assert "CLOISTER_KEY_PEPPER" in result.output


def test_the_shown_url_hides_only_the_password() -> None:
    assert (
        redact_url("postgresql+psycopg://app:pw@db:5432/c?sslmode=require")
        == "postgresql+psycopg://app:***@db:5432/c?sslmode=require"
    )
    assert redact_url("sqlite:////var/lib/cloister/cloister.db") == (
        "sqlite:////var/lib/cloister/cloister.db"
    )


def test_one_line_hides_a_quoted_password() -> None:
    url = "postgresql+psycopg://u:pa55word-x@db/c"
    error = RuntimeError("could not connect with pa55word-x\nsecond line")
    assert one_line(error, url) == "RuntimeError: could not connect with ***"
