"""The `cloister` CLI run in-process on a fresh SQLite database (cli.db in the test's
temporary folder), as the tenancy CLI tests drive it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select

from admin.models import AuditEvent
from tenancy.db import make_engine, make_session_factory


def cli_db_url(tmp_path: Path) -> str:
    """The database the CLI under test reads and writes."""
    return f"sqlite:///{tmp_path / 'cli.db'}"


def cli_with_acme(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    pepper: str,
    commands: Iterable[click.Command],
) -> click.Group:
    """A `cloister` group of `commands` on a fresh database, with tenant acme created."""
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_DATABASE_URL", cli_db_url(tmp_path))
    monkeypatch.setenv("CLOISTER_KEY_PEPPER", pepper)
    root = click.Group("cloister")
    for command in commands:
        root.add_command(command)
    assert run(root, "tenants", "create", "acme").exit_code == 0
    return root


def run(cli: click.Group, *args: str) -> Result:
    """Runs one command line of `cli` in-process."""
    return CliRunner().invoke(cli, list(args))


def audit(tmp_path: Path, action: str) -> list[AuditEvent]:
    """The audit events of `action` the CLI wrote to its database."""
    engine = make_engine(cli_db_url(tmp_path))
    with make_session_factory(engine)() as s:
        rows = list(s.scalars(select(AuditEvent).where(AuditEvent.action == action)))
    engine.dispose()
    return rows
