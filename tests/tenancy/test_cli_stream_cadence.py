"""`cloister tenants create/update --stream-cadence`: stored, shown, audited as
cli:<user>; a bad value exits 2 naming stream_cadence, no traceback, nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from cloister.commands.tenants import commands as tenant_commands
from tests.tenancy.cli_db import audit, cli_with_acme, run


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> click.Group:
    """The tenants group on a fresh SQLite database with tenant acme."""
    return cli_with_acme(
        tmp_path, monkeypatch, pepper="cli-cadence-pepper", commands=tenant_commands
    )


def cadence(cli: click.Group, name: str = "acme") -> str:
    tenants = json.loads(run(cli, "tenants", "list", "--json").output)
    return str({t["name"]: t for t in tenants}[name]["stream_cadence"])


def test_update_sets_shows_and_audits(cli: click.Group, tmp_path: Path) -> None:
    assert cadence(cli) == "token"
    res = run(cli, "tenants", "update", "acme", "--stream-cadence", "fixed:8", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["stream_cadence"] == "fixed:8"
    assert cadence(cli) == "fixed:8"
    (event,) = audit(tmp_path, "tenant.update")
    assert event.actor.startswith("cli:") and event.detail is not None
    assert event.detail["stream_cadence"] == "fixed:8"
    assert run(cli, "tenants", "update", "acme", "--weight", "2").exit_code == 0
    assert cadence(cli) == "fixed:8"  # another change keeps it
    assert run(cli, "tenants", "update", "acme", "--stream-cadence", "token").exit_code == 0
    assert cadence(cli) == "token"


def test_create_takes_a_cadence(cli: click.Group, tmp_path: Path) -> None:
    res = run(cli, "tenants", "create", "beta", "--stream-cadence", "fixed:1", "--json")
    assert res.exit_code == 0, res.output
    assert (
        json.loads(res.output)["stream_cadence"] == "fixed:1" and cadence(cli, "beta") == "fixed:1"
    )
    events = audit(tmp_path, "tenant.create")
    assert events[-1].detail is not None and events[-1].detail["stream_cadence"] == "fixed:1"


BAD = ["fixed:0", "fixed:-1", "fixed:100000", "fixed:abc", "chunky", "", "fixed:4;drop", "none"]


@pytest.mark.parametrize("value", BAD)
def test_bad_cadence_is_refused(cli: click.Group, tmp_path: Path, value: str) -> None:
    for args in (
        ("tenants", "update", "acme", "--stream-cadence", value),
        ("tenants", "create", "beta", "--stream-cadence", value),
    ):
        res = run(cli, *args)
        assert res.exit_code == 2, (args, res.exit_code, res.output, res.exception)
        assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
        assert "stream_cadence" in res.output, res.output
    assert cadence(cli) == "token"
    assert "beta" not in {
        t["name"] for t in json.loads(run(cli, "tenants", "list", "--json").output)
    }
    assert audit(tmp_path, "tenant.update") == []
