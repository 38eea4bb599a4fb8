"""No secret has a public default: generated per data directory, private, reused, required
in production; the database file is private too (issue 13, defect 4)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError

from admin.app import create_admin_app, make_services
from admin.identity import AdminIdentity, create_admin_token, issue_session
from admin.settings import AdminSettings
from assembly.database import prepare_database
from cloister.commands.keys import commands as key_commands
from cloister.commands.tenants import commands as tenant_commands
from server.settings import Settings
from tenancy.db import make_engine, make_session_factory
from tenancy.keys import find_key

SECRET_ENV = (
    "CLOISTER_KEY_PEPPER",
    "CLOISTER_ADMIN_SESSION_KEY",
    "CLOISTER_ADMIN_AUDIT_SIGNING_KEY",
    "CLOISTER_ENVIRONMENT",
    "CLOISTER_DATA_DIR",
    "CLOISTER_DATABASE_URL",
)
# The pepper every development server shared before: public, in the old source.
PUBLIC_PEPPER = "cloister-development-pepper-change-me"
ATTACKER = AdminIdentity(actor="oidc:attacker@example.com", role="admin")


@pytest.fixture(autouse=True)
def default_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default configuration: no secret given in the environment."""
    for name in SECRET_ENV:
        monkeypatch.delenv(name, raising=False)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def admin_client(tmp_path: Path) -> Iterator[tuple[Settings, TestClient]]:
    """The admin API of a development server in its default configuration."""
    settings = Settings(data_dir=tmp_path / "data")
    prepare_database(settings)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    services = make_services(
        sessions,
        pepper=settings.key_pepper.get_secret_value(),
        settings=AdminSettings.from_settings(settings),
    )
    with TestClient(create_admin_app(services)) as client:
        yield settings, client


def test_a_session_forged_with_the_public_pepper_is_refused(
    admin_client: tuple[Settings, TestClient],
) -> None:
    settings, client = admin_client
    forged = issue_session(PUBLIC_PEPPER, ATTACKER, 3600)
    r = client.get("/admin/api/v1/tenants", headers={"Authorization": f"Bearer {forged}"})
    assert r.status_code == 401, r.text
    made = client.post(
        "/admin/api/v1/tokens",
        json={"role": "admin"},
        headers={"Authorization": f"Bearer {forged}"},
    )
    assert made.status_code == 401
    # The pepper is not the session key either: whoever learns it still forges nothing.
    with_pepper = issue_session(settings.key_pepper.get_secret_value(), ATTACKER, 3600)
    r = client.get("/admin/api/v1/tenants", headers={"Authorization": f"Bearer {with_pepper}"})
    assert r.status_code == 401
    # What the server itself signs (an OIDC sign-in) works.
    real = issue_session(settings.admin_session_key.get_secret_value(), ATTACKER, 3600)
    r = client.get("/admin/api/v1/tenants", headers={"Authorization": f"Bearer {real}"})
    assert r.status_code == 200, r.text


def test_development_secrets_are_random_private_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Settings(data_dir=data)
    pepper = first.key_pepper.get_secret_value()
    session_key = first.admin_session_key.get_secret_value()
    assert len(bytes.fromhex(pepper)) == 32 and len(bytes.fromhex(session_key)) == 32
    assert pepper != session_key and PUBLIC_PEPPER not in (pepper, session_key)
    assert mode(data) == 0o700
    for name in ("key-pepper", "session-signing.key"):
        assert mode(data / name) == 0o600, name
    assert not [p for p in data.iterdir() if p.name.endswith(".tmp")]
    second = Settings(data_dir=data)  # a second start, or the CLI
    assert second.key_pepper.get_secret_value() == pepper
    assert second.admin_session_key.get_secret_value() == session_key
    assert AdminSettings.from_settings(second).session_key == first.admin_session_key
    other = Settings(data_dir=tmp_path / "other")
    assert other.key_pepper.get_secret_value() != pepper


def test_explicit_secrets_win_and_write_no_file(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, key_pepper=SecretStr("given"), admin_session_key=SecretStr("s")
    )
    assert settings.key_pepper.get_secret_value() == "given"
    assert settings.admin_session_key.get_secret_value() == "s"
    assert list(tmp_path.iterdir()) == []


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    Settings(data_dir=tmp_path)
    (tmp_path / "key-pepper").chmod(0o644)
    with pytest.raises(ValueError, match="readable by other users"):
        Settings(data_dir=tmp_path)


def test_the_public_pepper_is_refused_everywhere(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="public"):
        Settings(data_dir=tmp_path, key_pepper=SecretStr(PUBLIC_PEPPER))


def test_production_refuses_to_start_without_its_secrets(tmp_path: Path) -> None:
    base = {"environment": "production", "data_dir": tmp_path}
    with pytest.raises(ValidationError, match="CLOISTER_KEY_PEPPER must be set in production"):
        Settings(**base)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="CLOISTER_ADMIN_SESSION_KEY must be set"):
        Settings(**base, key_pepper=SecretStr("p"), admin_audit_signing_key=SecretStr("ab" * 32))  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # production never makes secrets up


def test_cli_keys_work_with_the_server_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path / "data"))
    root = click.Group("cloister")
    for command in [*tenant_commands, *key_commands]:
        root.add_command(command)
    runner = CliRunner()
    assert runner.invoke(root, ["tenants", "create", "acme"]).exit_code == 0
    out = runner.invoke(root, ["keys", "create", "--tenant", "acme", "--json"])
    assert out.exit_code == 0, out.output
    secret = json.loads(out.output)["key"]
    server = Settings()  # what `cloister serve` reads
    sessions = make_session_factory(make_engine(server.resolved_database_url))
    with sessions() as s:
        assert find_key(s, server.key_pepper.get_secret_value(), secret) is not None
        assert find_key(s, PUBLIC_PEPPER, secret) is None


def test_the_database_file_is_private(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", key_pepper=SecretStr("p"))
    prepare_database(settings)
    db = tmp_path / "data" / "cloister.db"
    assert mode(db) == 0o600
    assert mode(tmp_path / "data") == 0o700
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    with sessions() as s:
        create_admin_token(s, pepper="p", role="admin")  # a write: WAL files appear
    for extra in (db.with_name("cloister.db-wal"), db.with_name("cloister.db-shm")):
        if extra.exists():
            assert mode(extra) == 0o600, extra.name
    # A database left world-readable by an older version is made private on open.
    os.chmod(db, 0o644)
    make_engine(settings.resolved_database_url).dispose()
    assert mode(db) == 0o600


def test_an_empty_secret_file_is_refused_not_used(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    fd = os.open(tmp_path / "key-pepper", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    with pytest.raises(ValueError, match="empty"):
        Settings(data_dir=tmp_path)
