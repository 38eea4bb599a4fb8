"""The admin service's own settings (`settings.admin`; CLOISTER_ADMIN__NAME or
CLOISTER_ADMIN_NAME): OpenID Connect sign-in, console sessions, audit checkpoints,
metering and uploads. `admin.settings.AdminSettings` is the slice the service runs on,
built from these and the shared settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

# admin.roles.Role, repeated since this floor imports no service (a test keeps them equal).
AdminRole = Literal["admin", "operator", "viewer", "finance", "auditor", "tenant-admin"]
MAX_RETENTION_DAYS = 36_500  # a century: a timedelta of more days is no date at all


def check_oidc_scopes(value: str) -> str:
    """Space-separated OIDC scopes that include `openid`: without it the issuer returns
    no ID token, and sign-in would fail only once someone tried it."""
    if "openid" not in value.split():
        raise ValueError(f"the OIDC scopes must include openid, not {value!r}")
    return value


class AdminServiceSettings(BaseModel):
    """What only the admin service reads (its secrets stay with the shared settings,
    where the deployment's secret pins check them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The issuer's URL (discovery at /.well-known/openid-configuration); unset: no sign-in.
    oidc_issuer: str | None = None
    # The console's client at the issuer.
    oidc_client_id: str | None = None
    # The client's secret.
    oidc_client_secret: SecretStr | None = None
    # <host>/admin/api/v1/auth/callback as the issuer knows it.
    oidc_redirect_uri: str | None = None
    oidc_scopes: str = "openid email profile"  # space-separated; must hold openid
    # The ID token claims holding the role (one of AdminRole) and, for tenant-admin, the
    # tenant's id; a token without the role claim gets the default role (unset: refused).
    oidc_role_claim: str = Field(default="cloister_role", min_length=1)
    # See oidc_role_claim.
    oidc_tenant_claim: str = Field(default="cloister_tenant", min_length=1)
    # See oidc_role_claim.
    oidc_default_role: AdminRole | None = None
    session_ttl_s: int = Field(default=8 * 3600, ge=60)  # a console sign-in lasts this
    # A signed checkpoint after this many audit records.
    audit_checkpoint_every: int = Field(default=1000, ge=1)
    # Besides every N records, a running server signs the log's head this often and at
    # shutdown, so at most this many seconds of records are ever unsigned.
    audit_checkpoint_interval_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    spool_path: Path | None = None  # None: <data_dir>/usage-spool.jsonl
    # Raw usage records older than this are purged, hourly (the rollups billing reads stay).
    usage_retention_days: int = Field(default=90, ge=1, le=MAX_RETENTION_DAYS)
    # The largest adapter archive an upload may send.
    adapter_upload_max_bytes: int = Field(default=1024**3, ge=1)

    @field_validator("oidc_scopes")
    @classmethod
    def _check_oidc_scopes(cls, value: str) -> str:
        return check_oidc_scopes(value)

    @field_validator("oidc_default_role", mode="before")
    @classmethod
    def _empty_role_is_unset(cls, value: Any) -> Any:
        """CLOISTER_ADMIN_OIDC_DEFAULT_ROLE= (empty) is unset: tokens without a role are refused."""
        if isinstance(value, str) and not value.strip():
            return None
        return value
