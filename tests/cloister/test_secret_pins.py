"""Every process on one database holds the same secrets, or is refused before it serves or
changes anything (tenancy.secret_pins).

Found using the split deployment as an operator would: two development gateways with
their own data folders on one PostgreSQL. Each made its own key pepper, so a key made
through one was "incorrect" on the other, and the second's audit key signed checkpoints
that made `cloister audit verify` report a bad signature (tampering) from the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from assembly.database import prepare_database
from assembly.deployment_secrets import check_deployment_secrets
from cloister.cli import main
from server.settings import Settings
from tenancy import secret_pins
from tenancy.db import make_engine, make_session_factory
from tenancy.secret_pins import SecretMismatchError
from tests.cloister.test_secrets import SECRET_ENV
from tests.utils.services import postgres_database

SETTINGS = ("CLOISTER_KEY_PEPPER", "CLOISTER_ADMIN_SESSION_KEY", "CLOISTER_ADMIN_AUDIT_SIGNING_KEY")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_secrets_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRET_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def database(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.db'}"


def cli(*args: str) -> Result:
    env: dict[str, str | None] = dict.fromkeys(SECRET_ENV)
    return CliRunner().invoke(main, list(args), env=env)


def count(url: str, table: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def test_a_second_data_folder_on_one_database_is_refused_naming_each_secret(
    tmp_path: Path, database: str
) -> None:
    first = Settings(data_dir=tmp_path / "g1", database_url=database)
    second = Settings(data_dir=tmp_path / "g2", database_url=database)
    assert prepare_database(first) is True  # pins the first one's secrets
    assert count(database, "secret_pins") == 3
    assert prepare_database(first) is True  # the same secrets: still fine
    with pytest.raises(SecretMismatchError) as refused:
        prepare_database(second)
    message = str(refused.value)
    for setting in SETTINGS:
        assert setting in message
    # Where its values came from, and what to do about it.
    assert str(tmp_path / "g2" / "key-pepper") in message and "--data-dir" in message
    assert "cloister db secrets --repin --yes" in message
    # Never a secret, only fingerprints of them.
    for file in ("key-pepper", "session-signing.key", "audit-signing.key"):
        for folder in ("g1", "g2"):
            assert (tmp_path / folder / file).read_text().strip() not in message


def test_the_same_secrets_from_settings_serve_from_any_data_folder(
    tmp_path: Path, database: str
) -> None:
    shared = {
        "key_pepper": "p" * 40,
        "admin_session_key": "s" * 40,
        "admin_audit_signing_key": "ab" * 32,
    }
    prepare_database(Settings(data_dir=tmp_path / "g1", database_url=database, **shared))
    prepare_database(Settings(data_dir=tmp_path / "g2", database_url=database, **shared))
    other_audit_key = {**shared, "admin_audit_signing_key": "cd" * 32}
    with pytest.raises(SecretMismatchError) as refused:
        prepare_database(
            Settings(data_dir=tmp_path / "g3", database_url=database, **other_audit_key)
        )
    message = str(refused.value)
    assert "CLOISTER_ADMIN_AUDIT_SIGNING_KEY" in message
    assert "CLOISTER_KEY_PEPPER" not in message  # only what differs
    assert "set the same values on every process" in message  # none came from files


def test_two_first_starts_at_once_keep_the_first_pin(
    tmp_path: Path, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loser of the race to pin reads the winner's pin and is refused."""
    first = Settings(data_dir=tmp_path / "g1", database_url=database)
    second = Settings(data_dir=tmp_path / "g2", database_url=database)
    prepare_database(first)
    real = secret_pins.pin_states
    calls = []

    def unpinned_at_first(session: sa.orm.Session, held: list[secret_pins.DeploymentSecret]):  # type: ignore[no-untyped-def]
        calls.append(1)
        states = real(session, held)
        if len(calls) == 1:  # as the second process saw the table before the first wrote
            return [secret_pins.PinStatus(s.secret, "unpinned", None, None) for s in states]
        return states

    monkeypatch.setattr(secret_pins, "pin_states", unpinned_at_first)
    engine = make_engine(database)
    try:
        with pytest.raises(SecretMismatchError):
            check_deployment_secrets(second, make_session_factory(engine))
    finally:
        engine.dispose()
    assert len(calls) == 2
    monkeypatch.undo()
    check_deployment_secrets(first, make_session_factory(make_engine(database)))


def test_the_cli_refuses_to_make_a_key_the_gateways_would_refuse(
    tmp_path: Path, database: str
) -> None:
    g1, g2 = str(tmp_path / "g1"), str(tmp_path / "g2")
    assert (
        cli("tenants", "create", "acme", "--database-url", database, "--data-dir", g1).exit_code
        == 0
    )
    keys_before = count(database, "api_keys")
    audit_before = count(database, "audit_events")
    made = cli("keys", "create", "--tenant", "acme", "--database-url", database, "--data-dir", g2)
    assert made.exit_code == 1 and made.stdout == ""
    lines = made.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), made.stderr
    assert "CLOISTER_KEY_PEPPER" in lines[0] and "Traceback" not in made.output
    # Nothing made, nothing audited under the wrong key.
    assert count(database, "api_keys") == keys_before
    assert count(database, "audit_events") == audit_before


def test_db_secrets_shows_the_pins_and_repins_after_a_rotation(
    tmp_path: Path, database: str
) -> None:
    g1, g2 = str(tmp_path / "g1"), str(tmp_path / "g2")
    where1, where2 = (
        ["--database-url", database, "--data-dir", g1],
        ["--database-url", database, "--data-dir", g2],
    )
    assert cli("tenants", "create", "acme", *where1).exit_code == 0
    shown = cli("db", "secrets", *where1)
    assert shown.exit_code == 0, shown.output
    assert [line.split(":")[1].split(",")[0].strip() for line in shown.stdout.splitlines()] == [
        "matches"
    ] * 3
    differs = cli("db", "secrets", "--json", *where2)
    assert differs.exit_code == 1
    document = json.loads(differs.stdout)
    assert {s["name"]: s["state"] for s in document["secrets"]} == {
        "api_keys": "differs",
        "console_sessions": "differs",
        "audit_checkpoints": "differs",
    }
    assert "differ from this database's pins" in differs.stderr
    unconfirmed = cli("db", "secrets", "--repin", *where2)
    assert unconfirmed.exit_code == 2 and "--yes" in unconfirmed.stderr
    audit_before = count(database, "audit_events")
    repinned = cli("db", "secrets", "--repin", "--yes", "--json", *where2)
    assert repinned.exit_code == 0, repinned.output
    assert json.loads(repinned.stdout)["repinned"] == [
        "api_keys",
        "console_sessions",
        "audit_checkpoints",
    ]
    assert count(database, "audit_events") == audit_before + 1  # the repin is audited
    # Now the second folder's secrets are the deployment's, and the first is refused.
    assert cli("tenants", "list", *where2).exit_code == 0
    old = cli("tenants", "list", *where1)
    assert old.exit_code == 1 and "CLOISTER_KEY_PEPPER" in old.stderr
    verified = cli("audit", "verify", *where2)
    assert verified.exit_code == 0, verified.output


def test_cloister_serve_with_another_folders_secrets_exits_with_one_line(
    tmp_path: Path,
) -> None:
    """On the real PostgreSQL, as two development gateways sharing it would."""
    with postgres_database() as url:
        assert (
            cli(
                "tenants",
                "create",
                "acme",
                "--database-url",
                url,
                "--data-dir",
                str(tmp_path / "g1"),
            ).exit_code
            == 0
        )
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.update(CLOISTER_DATABASE_URL=url, CLOISTER_DATA_DIR=str(tmp_path / "g2"))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "platform")])
        done = subprocess.run(
            [sys.executable, "-c", "from cloister.cli import main; main()", "serve", "--port", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "CLOISTER_KEY_PEPPER" in errors[0], done.stderr
    assert str(tmp_path / "g2" / "key-pepper") in errors[0]


def test_db_secrets_without_a_location_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    refused = cli("db", "secrets")
    assert refused.exit_code == 1 and "no database at" in refused.stderr
    assert list(tmp_path.iterdir()) == []  # no data folder, no secrets made
