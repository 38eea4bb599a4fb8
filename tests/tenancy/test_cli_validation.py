"""Out-of-range CLI input: a clear error with exit code 2 and no traceback, nothing stored."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from cloister.commands import billing as billing_cmd
from cloister.commands.keys import commands as key_commands
from cloister.commands.tenants import commands as tenant_commands
from server.settings import Settings
from tenancy.db import make_engine, make_session_factory
from tenancy.models import ApiKey


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> click.Group:
    """The tenants, keys and billing groups on a fresh SQLite database."""
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CLOISTER_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("CLOISTER_KEY_PEPPER", "cli-validation-pepper")
    root = click.Group("cloister")
    for command in [*tenant_commands, *key_commands, *billing_cmd.commands]:
        root.add_command(command)
    return root


def run(cli: click.Group, *args: str) -> Result:
    # catch_exceptions: an uncaught exception (a traceback for a user) shows as exit code 1
    # with `exception` set, so the assertions below see it instead of pytest.
    return CliRunner().invoke(cli, list(args))


def assert_refused(res: Result, *words: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    for word in words:
        assert word in res.output, res.output


def tenant_names(cli: click.Group) -> list[str]:
    return [t["name"] for t in json.loads(run(cli, "tenants", "list", "--json").output)]


@pytest.mark.parametrize("name", ["a/b", "nul\x00name", "-dash", ".dot", "x" * 64, "sp ace"])
def test_bad_tenant_names_are_refused(cli: click.Group, name: str) -> None:
    assert_refused(run(cli, "tenants", "create", "--", name), "tenant name")
    assert tenant_names(cli) == []


@pytest.mark.parametrize("weight", ["inf", "Infinity", "nan", "1e-300", "0", "-1", "101"])
def test_bad_weights_are_refused(cli: click.Group, weight: str) -> None:
    assert_refused(run(cli, "tenants", "create", "acme", "--weight", weight), "weight")
    assert tenant_names(cli) == []


def test_good_tenant_still_created(cli: click.Group) -> None:
    res = run(cli, "tenants", "create", "Acme.prod_1-x", "--weight", "0.01")
    assert res.exit_code == 0, res.output
    assert tenant_names(cli) == ["Acme.prod_1-x"]


@pytest.mark.parametrize(
    "args",
    [
        ("--name", "k" * 129),
        ("--expires-in-days", "1e10"),
        ("--expires-in-days", "inf"),
    ],
)
def test_bad_key_options_are_refused(cli: click.Group, args: tuple[str, ...]) -> None:
    run(cli, "tenants", "create", "acme")
    assert_refused(run(cli, "keys", "create", "--tenant", "acme", *args))
    assert json.loads(run(cli, "keys", "list", "--tenant", "acme", "--json").output) == []


def test_keys_list_shows_expired_keys_as_expired(cli: click.Group) -> None:
    run(cli, "tenants", "create", "acme")
    old = json.loads(run(cli, "keys", "create", "--tenant", "acme", "--json").output)["id"]
    new = json.loads(run(cli, "keys", "create", "--tenant", "acme", "--json").output)["id"]
    engine = make_engine(Settings().resolved_database_url)
    with make_session_factory(engine)() as s:
        key = s.get(ApiKey, old)
        assert key is not None
        key.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        s.commit()
    engine.dispose()
    rows = json.loads(run(cli, "keys", "list", "--tenant", "acme", "--json").output)
    assert {r["id"]: r["status"] for r in rows} == {old: "expired", new: "active"}
    table = run(cli, "keys", "list", "--tenant", "acme").output.splitlines()
    assert [line.split()[0] for line in table if "expired" in line] == [old]


@pytest.mark.parametrize("period", ["9999-12", "9999-12-31", "2026-13", "abc", "2026-02-30"])
def test_billing_export_bad_period_is_a_clear_error(cli: click.Group, period: str) -> None:
    assert_refused(run(cli, "billing", "export", "--period", period), "period")


@pytest.mark.parametrize(
    "args", [("--rpm", str(10**30)), ("--tpm", str(2**31)), ("--budget", str(10**20))]
)
def test_limit_values_past_the_column_range_are_refused(
    cli: click.Group, args: tuple[str, ...]
) -> None:
    run(cli, "tenants", "create", "acme")
    assert_refused(run(cli, "tenants", "set-limits", "acme", *args), "integer")
    limits = json.loads(run(cli, "tenants", "set-limits", "acme", "--json").output)
    assert (limits["rpm"], limits["tpm"], limits["token_budget"]) == (None, None, None)
