"""The one Settings object: development defaults, production refusals, the admin slice."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from cloister.settings import Settings


def test_development_audit_key_is_made_once_and_private(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = settings.admin_settings().audit_signing_key
    second = Settings(data_dir=tmp_path).admin_settings().audit_signing_key
    assert first is not None and second is not None
    assert first.get_secret_value() == second.get_secret_value()
    assert len(bytes.fromhex(first.get_secret_value())) == 32
    mode = stat.S_IMODE((tmp_path / "audit-signing.key").stat().st_mode)
    assert mode == 0o600


def test_explicit_admin_values_win(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        admin_audit_signing_key=SecretStr("ab" * 32),
        admin_spool_path=tmp_path / "s",
    )
    admin = settings.admin_settings()
    assert admin.audit_signing_key is not None
    assert admin.audit_signing_key.get_secret_value() == "ab" * 32
    assert admin.spool_path == tmp_path / "s"
    assert not (tmp_path / "audit-signing.key").exists()


def test_production_refuses_development_secrets() -> None:
    with pytest.raises(ValidationError, match="KEY_PEPPER"):
        Settings(environment="production")
    with pytest.raises(ValidationError, match="AUDIT_SIGNING_KEY"):
        Settings(
            environment="production",
            key_pepper=SecretStr("a-real-pepper"),
            admin_session_key=SecretStr("a-real-session-key"),
        )
    ok = Settings(
        environment="production",
        key_pepper=SecretStr("a-real-pepper"),
        admin_session_key=SecretStr("a-real-session-key"),
        admin_audit_signing_key=SecretStr("cd" * 32),
    )
    assert ok.environment == "production"
