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
    model: str | None = None  # None: the bundled SmolLM2-135M-Instruct GGUF
    model_name: str = "smollm2-135m-instruct"
    # The engine (see engine/config.py). "auto": CUDA when a GPU is there, else the CPU;
    # on CUDA bf16 and triton attention, on the CPU fp32 and the torch reference.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attention_backend: Literal["torch", "triton", "auto"] = "auto"
    prefix_cache: Literal["hash", "radix", "off"] = "hash"
    # Fair across tenants (virtual token counters, weighted by the tenant's weight),
    # longest prefix match within one tenant's own queue.
    scheduling_policy: Literal["fair_lpm", "fair", "lpm", "fcfs"] = "fair_lpm"
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    prefill_chunk_size: int | None = Field(default=None, ge=1)
    block_size: int = Field(default=16, ge=1, le=1024)
    # The KV pool: an explicit budget in bytes, else (on CUDA) this fraction of the GPU.
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    retention_ttl_s: float | None = Field(default=None, gt=0.0)  # idle cached blocks
    scrub_freed_blocks: bool = False  # zero KV blocks when they leave a cache domain
    strict_partition: bool = False  # no cross-domain eviction; domains cache <= their floor
    # Every cache domain's floor: cached blocks no other domain's traffic evicts (the larger).
    min_cached_blocks: int = Field(default=0, ge=0)
    min_cached_share: float = Field(default=0.0, ge=0.0, le=1.0)
    enforce_eager: bool = False  # never capture CUDA graphs
    # Where the engine loop runs: "thread" (a thread of the server process, the embedded
    # default) or "process" (a child process of its own, so that the HTTP event loop and
    # the engine never wait for each other's GIL; the better choice under load).
    engine_mode: Literal["thread", "process"] = "thread"
    kv_cache_bytes: int | None = Field(default=None, ge=1)
    max_num_seqs: int = Field(default=64, ge=1)
    max_waiting: int = Field(default=256, ge=1)
    max_model_len: int | None = Field(default=8192, ge=1)
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
