"""Admin service settings: the slice of the one Settings object (CLOISTER_ADMIN_*) it reads."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from admin.roles import Role
from server.settings import MAX_RETENTION_DAYS, Settings, check_oidc_scopes


class AdminSettings(BaseModel):
    """OIDC issuer, audit signing key, metering spool and retention. Frozen once built."""

    model_config = ConfigDict(frozen=True)

    # OpenID Connect: any standard issuer with discovery at /.well-known/openid-configuration.
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: SecretStr | None = None
    oidc_redirect_uri: str | None = None
    oidc_scopes: str = "openid email profile"
    # Claim holding the role (admin.roles.ROLES) and, for tenant-admin, the tenant.
    oidc_role_claim: str = Field(default="cloister_role", min_length=1)
    oidc_tenant_claim: str = Field(default="cloister_tenant", min_length=1)
    # The role of users whose token lacks the role claim; None: they are refused.
    oidc_default_role: Role | None = None
    session_ttl_s: int = Field(default=8 * 3600, ge=60)
    # HMAC key for session tokens and the sign-in cookie (never the key pepper, which
    # hashes stored credentials). None: a random key per process, so sessions end with it.
    session_key: SecretStr | None = None
    # Hex Ed25519 private key (32 bytes) for audit checkpoints; None: checkpoints unsigned -> refused.
    audit_signing_key: SecretStr | None = None
    audit_checkpoint_every: int = Field(default=1000, ge=1)
    # A running server also signs the head this often, and at shutdown; None: only at N.
    audit_checkpoint_interval_s: float | None = Field(default=60.0, gt=0)
    # A copy of the newest checkpoint outside the database; None: not kept.
    audit_head_path: Path | None = None
    spool_path: Path = Path("./var/usage-spool.jsonl")
    # Raw usage records older than this are purged (admin.usage_retention); the hourly
    # rollups that billing reads are kept. At most a century: older is no date at all.
    usage_retention_days: int = Field(default=90, ge=1, le=MAX_RETENTION_DAYS)
    # Folders (or files) that model and adapter sources must resolve under; empty: none allowed.
    model_roots: tuple[Path, ...] = ()
    adapter_upload_max_bytes: int = Field(default=1024**3, ge=1)  # the zip as uploaded
    # The engines' largest LoRA rank: an upload of a larger one is refused, as they would.
    max_lora_rank: int = Field(default=16, ge=1, le=1024)
    # Bad admin credentials per source (client address) and window before 429; 0: no limit.
    auth_failure_limit: int = Field(default=20, ge=0)
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    # Denials are audited as one record per source, actor and outcome per this window.
    audit_denial_window_s: float = Field(default=60.0, gt=0)

    @field_validator("oidc_scopes")
    @classmethod
    def _check_scopes(cls, value: str) -> str:
        return check_oidc_scopes(value)

    @classmethod
    def from_settings(cls, settings: Settings) -> AdminSettings:
        """The admin service's slice of the server's settings, each field from its
        `CLOISTER_ADMIN_*` (or shared) setting (`Settings.admin_values`)."""
        return cls(**settings.admin_values(cls.model_fields))
