"""The one settings object: environment variables with the CLOISTER_ prefix, flags override."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from admin.settings import AdminSettings

DEV_PEPPER = "cloister-development-pepper-change-me"


class Settings(BaseSettings):
    """Service settings. Built once at start-up and passed down; never mutated."""

    model_config = SettingsConfigDict(env_prefix="CLOISTER_", frozen=True, extra="ignore")

    environment: Literal["development", "production"] = "development"
    data_dir: Path = Path("./var")
    database_url: str | None = None  # None: SQLite at <data_dir>/cloister.db
    redis_url: str | None = None  # None: the in-memory limiter
    redis_key_prefix: str = "cloister:lim:"  # gateways sharing limits share the prefix
    host: str = "127.0.0.1"
    port: int = 8000
    # HMAC pepper for API-key hashes. The development default is refused in production.
    key_pepper: SecretStr = SecretStr(DEV_PEPPER)
    limiter_fail_mode: Literal["open", "closed"] = "open"
    limiter_local_cap_rpm: int = 600  # per-process cap applied while Redis is unreachable
    # A request over its concurrency limit: "reject" (429 at once) or "queue" (wait for a
    # slot up to concurrency_queue_timeout_s, then 429).
    concurrency_mode: Literal["reject", "queue"] = "reject"
    concurrency_queue_timeout_s: float = Field(default=30.0, ge=0.0)
    config_refresh_s: float = 2.0  # how stale tenant/key/limit data may be on a running server
    # While the database cannot answer, keys seen within config_refresh_s + this are still
    # served from the gateway's cache; anything else gets 503 with Retry-After.
    auth_max_stale_s: float = Field(default=300.0, ge=0.0)
    auth_read_timeout_s: float = Field(default=2.0, gt=0.0)  # one key read, before falling back
    # Bad credentials per client address and window before 429 (gateway and admin); 0: off.
    auth_failure_limit: int = Field(default=20, ge=0)
    auth_failure_window_s: float = Field(default=60.0, gt=0.0)
    audit_denial_window_s: float = Field(default=60.0, gt=0.0)  # one denial record per window
    db_pool_size: int = Field(default=8, ge=1)  # the admin API's pool (the gateway has its own)
    model: str | None = None  # None: the bundled SmolLM2-135M-Instruct GGUF
    model_name: str = "smollm2-135m-instruct"
    attention_backend: Literal["torch", "triton", "auto"] = "auto"
    # Where the engine loop runs: "thread" (a thread of the server process, the embedded
    # default) or "process" (a child process of its own, so that the HTTP event loop and
    # the engine never wait for each other's GIL; the better choice under load).
    engine_mode: Literal["thread", "process"] = "thread"
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 64
    max_waiting: int = 256
    max_model_len: int | None = 8192
    log_level: str = "INFO"
    metrics_top_tenants: int = Field(default=20, ge=1)
    max_n: int = Field(default=16, ge=1)  # most choices one request may ask for
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    # Admin service (CLOISTER_ADMIN_*): OpenID Connect sign-in, audit signing, metering.
    admin_oidc_issuer: str | None = None
    admin_oidc_client_id: str | None = None
    admin_oidc_client_secret: SecretStr | None = None
    admin_oidc_redirect_uri: str | None = None
    # Hex Ed25519 seed for audit checkpoints. In development a key is made once and kept in
    # <data_dir>/audit-signing.key; production refuses to start without one.
    admin_audit_signing_key: SecretStr | None = None
    admin_audit_checkpoint_every: int = Field(default=1000, ge=1)
    admin_spool_path: Path | None = None  # None: <data_dir>/usage-spool.jsonl
    admin_usage_retention_days: int = Field(default=90, ge=1)

    @model_validator(mode="after")
    def _refuse_dev_secrets_in_production(self) -> Settings:
        if self.environment == "production":
            if self.key_pepper.get_secret_value() == DEV_PEPPER:
                raise ValueError("CLOISTER_KEY_PEPPER must be set in production")
            if self.admin_audit_signing_key is None:
                raise ValueError("CLOISTER_ADMIN_AUDIT_SIGNING_KEY must be set in production")
        return self

    def admin_settings(self) -> AdminSettings:
        """The admin service's slice of these settings."""
        from admin.settings import AdminSettings

        return AdminSettings(
            oidc_issuer=self.admin_oidc_issuer,
            oidc_client_id=self.admin_oidc_client_id,
            oidc_client_secret=self.admin_oidc_client_secret,
            oidc_redirect_uri=self.admin_oidc_redirect_uri,
            audit_signing_key=self.admin_audit_signing_key or self._development_signing_key(),
            audit_checkpoint_every=self.admin_audit_checkpoint_every,
            spool_path=self.admin_spool_path or self.data_dir / "usage-spool.jsonl",
            usage_retention_days=self.admin_usage_retention_days,
            auth_failure_limit=self.auth_failure_limit,
            auth_failure_window_s=self.auth_failure_window_s,
            audit_denial_window_s=self.audit_denial_window_s,
        )

    def _development_signing_key(self) -> SecretStr:
        """A per-data-directory audit key for development, created once with mode 0600."""
        path = self.data_dir / "audit-signing.key"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(32))
        return SecretStr(path.read_text(encoding="ascii").strip())

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to SQLite inside the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'cloister.db').resolve()}"
