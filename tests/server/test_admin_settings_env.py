"""Every admin setting is reached from a CLOISTER_* variable: AdminSettings is derived
from the one Settings object, not copied by hand, so none can be left unreachable."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import SecretStr

from admin.roles import ROLES
from admin.settings import AdminSettings
from server.settings import AdminRole, Settings

# A value other than the default for each admin setting, as its variable is written.
SAMPLES: dict[str, str] = {
    "oidc_issuer": "https://id.example.com",
    "oidc_client_id": "cloister-console",
    "oidc_client_secret": "client-secret",
    "oidc_redirect_uri": "https://cloister.example.com/admin/api/v1/auth/callback",
    "oidc_scopes": "openid email groups",
    "oidc_role_claim": "https://example.com/role",
    "oidc_tenant_claim": "org",
    "oidc_default_role": "viewer",
    "session_ttl_s": "900",
    "session_key": "ab" * 32,
    "audit_signing_key": "5a" * 32,
    "audit_checkpoint_every": "7",
    "audit_checkpoint_interval_s": "9.5",
    "spool_path": "/srv/cloister/spool.jsonl",
    "usage_retention_days": "30",
    "model_roots": "/srv/models",
    "adapter_upload_max_bytes": "4096",
    "max_lora_rank": "32",
    "auth_failure_limit": "3",
    "auth_failure_window_s": "7.5",
    "audit_denial_window_s": "11.0",
}
# Worked out from other settings, so no variable of its own.
DERIVED = {"audit_head_path"}


def _variable(name: str) -> str:
    """The variable an admin setting is read from: CLOISTER_ADMIN_<NAME>, or the shared
    CLOISTER_<NAME> where the gateway reads the same setting."""
    if f"admin_{name}" in Settings.setting_names():
        return f"CLOISTER_ADMIN_{name.upper()}"
    return f"CLOISTER_{name.upper()}"


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, tuple):
        return tuple(str(v) for v in value)
    return str(value)


@pytest.mark.parametrize("name", sorted(set(AdminSettings.model_fields) - DERIVED))
def test_each_admin_setting_is_read_from_its_variable(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sample = SAMPLES[name]  # a new admin setting needs a sample here
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(_variable(name), sample)
    value = getattr(AdminSettings.from_settings(Settings()), name)
    assert value != AdminSettings.model_fields[name].default
    expected: Any = (sample,) if name == "model_roots" else sample
    assert _plain(value) == expected


def test_the_audit_head_copy_lives_in_the_data_dir(tmp_path: Path) -> None:
    head = AdminSettings.from_settings(Settings(data_dir=tmp_path)).audit_head_path
    assert head is not None and head.parent == tmp_path


def test_an_admin_setting_without_a_variable_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Grown(AdminSettings):
        frobnicate_s: float = 1.0

    with pytest.raises(RuntimeError, match="CLOISTER_ADMIN_FROBNICATE_S"):
        Grown.from_settings(Settings(data_dir=tmp_path))


def test_the_default_role_choices_are_the_admin_roles() -> None:
    assert get_args(AdminRole) == ROLES


def test_the_unread_metering_settings_are_gone() -> None:
    assert not {"metering_batch", "metering_retry_s"} & set(AdminSettings.model_fields)
