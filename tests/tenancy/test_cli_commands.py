"""The `tenants` and `keys` CLI groups, driven through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from cloister.commands.keys import commands as key_commands
from cloister.commands.tenants import commands as tenant_commands
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory
from tenancy.errors import AuthenticationError

PEPPER = "cli-test-pepper"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> click.Group:
    """A root group holding the two command groups, on a fresh SQLite database."""
    monkeypatch.setenv("CLOISTER_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("CLOISTER_KEY_PEPPER", PEPPER)
    root = click.Group("cloister")
    for command in [*tenant_commands, *key_commands]:
        root.add_command(command)
    return root


def run(cli: click.Group, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_tenant_lifecycle_and_limits(cli: click.Group) -> None:
    created = json.loads(
        run(cli, "tenants", "create", "acme", "--isolation", "user", "--json").output
    )
    assert created["name"] == "acme" and created["isolation_level"] == "user"
    dup = run(cli, "tenants", "create", "acme")
    assert dup.exit_code == 1 and "already exists" in dup.output
    res = run(
        cli,
        "tenants",
        "set-limits",
        "acme",
        "--rpm",
        "5",
        "--budget",
        "1000",
        "--budget-period",
        "day",
        "--models",
        "m1, m2",
        "--json",
    )
    limits = json.loads(res.output)
    assert limits["rpm"] == 5 and limits["token_budget"] == 1000
    assert limits["budget_period"] == "day" and limits["allowed_models"] == ["m1", "m2"]
    assert limits["tpm"] is None
    # Only the options given change.
    limits = json.loads(run(cli, "tenants", "set-limits", "acme", "--tpm", "900", "--json").output)
    assert (limits["rpm"], limits["tpm"]) == (5, 900)
    rows = json.loads(run(cli, "tenants", "list", "--json").output)
    assert [r["name"] for r in rows] == ["acme"]
    assert run(cli, "tenants", "suspend", "acme").exit_code == 0
    assert json.loads(run(cli, "tenants", "list", "--json").output)[0]["status"] == "suspended"
    assert run(cli, "tenants", "resume", "acme").exit_code == 0
    assert "acme" in run(cli, "tenants", "list").output


def test_clear_errors(cli: click.Group) -> None:
    res = run(cli, "tenants", "set-limits", "ghost", "--rpm", "1")
    assert res.exit_code == 1 and "no tenant named 'ghost'" in res.output
    assert run(cli, "tenants", "set-limits", "ghost", "--rpm", "-1").exit_code == 2
    assert run(cli, "tenants", "create", "x", "--weight", "0").exit_code == 2
    res = run(cli, "keys", "create", "--tenant", "ghost")
    assert res.exit_code == 1 and "ghost" in res.output
    res = run(cli, "keys", "revoke", "key_nope")
    assert res.exit_code == 1 and "no key" in res.output


def test_keys_shown_once_and_changes_reach_a_live_authenticator(
    cli: click.Group, tmp_path: Path
) -> None:
    run(cli, "tenants", "create", "acme")
    out = json.loads(
        run(
            cli, "keys", "create", "--tenant", "acme", "--name", "ci", "--models", "m1", "--json"
        ).output
    )
    assert set(out) == {"id", "key"} and out["key"].startswith("sk-clo-")
    listed = run(cli, "keys", "list", "--tenant", "acme", "--json").output
    assert out["key"] not in listed
    row = json.loads(listed)[0]
    assert row["id"] == out["id"] and row["prefix"] == out["key"][:11]
    assert row["allowed_models"] == ["m1"]

    engine = make_engine(f"sqlite:///{tmp_path / 'cli.db'}")
    clock = [0.0]
    auth = Authenticator(
        make_session_factory(engine), PEPPER, refresh_s=1.0, clock=lambda: clock[0]
    )
    assert auth.authenticate(out["key"]).limits.rpm is None
    run(cli, "tenants", "set-limits", "acme", "--rpm", "7")
    clock[0] += 1.0
    assert auth.authenticate(out["key"]).limits.rpm == 7
    assert "revoked" in run(cli, "keys", "revoke", out["id"]).output
    clock[0] += 1.0
    with pytest.raises(AuthenticationError) as err:
        auth.authenticate(out["key"])
    assert err.value.reason == "revoked"
    engine.dispose()
