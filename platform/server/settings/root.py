"""The one settings object: the values both services share at the top, each part's own
in a nested group (engine, gateway, telemetry, responses, admin).

Read from CLOISTER_* environment variables, a group's field as CLOISTER_<GROUP>__NAME
or by its flat name (server.settings.flat_names); keyword arguments (the CLI's flags)
override both.
"""

from __future__ import annotations

import hashlib
import importlib.util
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from engine.kv_events_endpoint import binds
from server.settings.admin import AdminServiceSettings
from server.settings.engine import EngineSettings
from server.settings.flat_names import (
    ENV_PREFIX,
    FLAT_NAMES,
    GROUPS,
    NESTED_DELIMITER,
    FlatEnvSource,
    nest_flat_values,
)
from server.settings.gateway import GatewaySettings
from server.settings.responses import ResponsesSettings
from server.settings.secret_files import (
    PUBLIC_PEPPER,
    development_secret,
    read_or_create_secret,
)
from server.settings.served_models import BUNDLED_MODEL_PACKAGE, ModelSpec, parse_model_entries
from server.settings.telemetry import TelemetrySettings


class Settings(BaseSettings):
    """Service settings. Built once at start-up and passed down; never mutated."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        frozen=True,
        extra="ignore",
    )

    # Production refuses development's secret files and any missing secret.
    environment: Literal["development", "production"] = "development"
    # SQLite database, development secrets, the usage spool, batch files, models/.
    data_dir: Path = Path("./var")
    database_url: str | None = None  # None: SQLite at <data_dir>/cloister.db
    redis_url: str | None = None  # None: the in-memory limiter
    # The address `cloister serve` listens on.
    host: str = "127.0.0.1"
    # The port `cloister serve` listens on.
    port: int = 8000
    # HMAC pepper for API-key and admin-token hashes. Development makes one per data
    # directory (<data_dir>/key-pepper); production refuses to start without one.
    key_pepper: SecretStr = Field(default_factory=development_secret("key-pepper"))
    # HMAC key for admin session tokens and the sign-in cookie, separate from the pepper.
    # Development makes one per data directory (<data_dir>/session-signing.key).
    admin_session_key: SecretStr = Field(default_factory=development_secret("session-signing.key"))
    # Hex Ed25519 seed for audit checkpoints. In development a key is made once and kept in
    # <data_dir>/audit-signing.key; production refuses to start without one.
    admin_audit_signing_key: SecretStr | None = None
    # The credential between gateways and engine servers (both sides read it).
    service_token: SecretStr | None = None
    # Bad credentials per client address and window before 429 (gateway and admin); 0: off.
    auth_failure_limit: int = Field(default=20, ge=0)
    # The window auth_failure_limit counts in.
    auth_failure_window_s: float = Field(default=60.0, gt=0.0)
    # The proxies whose X-Forwarded-For and X-Forwarded-Proto are believed: addresses
    # and networks, comma-separated; "*" for any, empty for none. The client address
    # they give is what the throttle above counts and what the audit log records, so
    # behind an ingress or load balancer name its addresses: otherwise every client
    # has the proxy's address, and one client's bad keys throttle all the others.
    forwarded_allow_ips: Annotated[tuple[str, ...], NoDecode] = ("127.0.0.1", "::1")
    audit_denial_window_s: float = Field(default=60.0, gt=0.0)  # one denial record per window
    db_pool_size: int = Field(default=8, ge=1)  # the admin API's pool (the gateway has its own)
    model: str | None = None  # None: the bundled SmolLM2-135M-Instruct GGUF
    # The name clients give as `model` for the one served model.
    model_name: str = "smollm2-135m-instruct"
    # Several base models, each on its own engine (and cache): NAME=PATH entries, from
    # CLOISTER_MODELS as a JSON list or comma-separated. Empty: the one `model` above.
    # Given, it replaces `model` and `model_name` (setting those too is refused).
    models: Annotated[tuple[ModelSpec, ...], NoDecode] = ()
    # Folders model and adapter sources must lie in, separated by os.pathsep. None: the data
    # directory's models/ and adapters/, the bundled model's folder and CLOISTER_MODEL.
    model_roots: str | None = None

    engine: EngineSettings = EngineSettings()
    gateway: GatewaySettings = GatewaySettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    responses: ResponsesSettings = ResponsesSettings()
    admin: AdminServiceSettings = AdminServiceSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The usual sources, with the nested settings' flat names beside the environment's."""
        flat = FlatEnvSource(settings_cls)
        return init_settings, env_settings, flat, dotenv_settings, file_secret_settings

    @classmethod
    def setting_names(cls) -> frozenset[str]:
        """Every flat name a setting is given by (CLOISTER_ + the name in upper case)."""
        top = {name for name in cls.model_fields if name not in GROUPS}
        return frozenset(top | set(FLAT_NAMES))

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_names(cls, data: Any) -> Any:
        return nest_flat_values(data)

    @field_validator("forwarded_allow_ips", mode="before")
    @classmethod
    def _parse_forwarded_allow_ips(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        entries = tuple(value or ())
        if "*" in entries and len(entries) > 1:
            raise ValueError('"*" trusts every proxy; give it alone, not with addresses')
        for entry in entries:
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry)  # an address is a network of one
            except ValueError:
                raise ValueError(
                    "a trusted proxy is an IP address or network (10.0.0.5, 10.0.0.0/8, "
                    f"fd00::/8) or *, not {entry!r}"
                ) from None
        return entries

    @field_validator("models", mode="before")
    @classmethod
    def _parse_models(cls, value: Any) -> Any:
        if isinstance(value, str | list) or (
            isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        ):
            return parse_model_entries(value)
        return value

    @model_validator(mode="after")
    def _one_binder_per_endpoint(self) -> Settings:
        """Each served model has an engine of its own, and one port binds once."""
        endpoint = self.engine.kv_events_endpoint
        if endpoint is not None and binds(endpoint) and len(self.served_models) > 1:
            raise ValueError(
                f"kv_events_endpoint {endpoint} binds, and each of the "
                f"{len(self.served_models)} served models would bind it: give the address "
                "of a subscriber to connect to (tcp://HOST:PORT) instead"
            )
        replay = self.engine.kv_events_replay_endpoint
        if replay is not None and len(self.served_models) > 1:
            raise ValueError(
                f"kv_events_replay_endpoint {replay} binds, and each of the "
                f"{len(self.served_models)} served models would bind it: replay serves "
                "one model's engine (one `cloister engine serve` per model)"
            )
        return self

    @model_validator(mode="after")
    def _refuse_models_with_model(self) -> Settings:
        if self.models and self.model is not None:
            raise ValueError("give models (NAME=PATH entries) or model (one path), not both")
        if self.models and "model_name" in self.model_fields_set:
            raise ValueError("model_name names the single model; with models, name each there")
        return self

    @model_validator(mode="after")
    def _refuse_redis_responses_without_redis(self) -> Settings:
        if self.responses.store == "redis" and self.redis_url is None:
            raise ValueError("responses_store=redis needs redis_url (CLOISTER_REDIS_URL)")
        return self

    @property
    def served_models(self) -> tuple[ModelSpec, ...]:
        """The base models to serve, in order: `models`, else the one `model`/`model_name`."""
        return self.models or (ModelSpec(name=self.model_name, path=self.model),)

    @model_validator(mode="after")
    def _refuse_missing_or_public_secrets(self) -> Settings:
        for name, value in (
            ("CLOISTER_KEY_PEPPER", self.key_pepper),
            ("CLOISTER_ADMIN_SESSION_KEY", self.admin_session_key),
        ):
            secret = value.get_secret_value()
            if not secret:
                where = " in production" if self.environment == "production" else ""
                raise ValueError(f"{name} must be set{where}")
            if secret == PUBLIC_PEPPER:
                raise ValueError(f"{name} is the old public development value; choose a secret")
        if self.environment == "production" and self.admin_audit_signing_key is None:
            raise ValueError("CLOISTER_ADMIN_AUDIT_SIGNING_KEY must be set in production")
        return self

    def admin_values(self, names: Iterable[str]) -> dict[str, Any]:
        """The admin service's settings `names` (`AdminSettings`' fields) from these.

        Each `f` is the admin group's `f`, else the shared `admin_f` or `f`, else the
        engine's `f` (the LoRA rank uploads are checked against), unless it is worked out
        below. No copy by hand: an admin setting added without a field here is refused at
        once rather than left at its default where no environment variable reaches it.
        (`AdminSettings.from_settings` calls this, so that this floor imports no service.)
        """
        derived: dict[str, Any] = {
            "audit_signing_key": self.admin_audit_signing_key or self._development_signing_key(),
            "audit_head_path": self._audit_head_path(),
            "spool_path": self.admin.spool_path or self.data_dir / "usage-spool.jsonl",
            "model_roots": self.resolved_model_roots,
        }
        shared = type(self).model_fields
        values: dict[str, Any] = {}
        for name in names:
            if name in derived:
                values[name] = derived[name]
            elif name in AdminServiceSettings.model_fields:
                values[name] = getattr(self.admin, name)
            elif f"admin_{name}" in shared:
                values[name] = getattr(self, f"admin_{name}")
            elif name in shared and name not in GROUPS:
                values[name] = getattr(self, name)
            elif name in EngineSettings.model_fields:
                values[name] = getattr(self.engine, name)
            else:
                raise RuntimeError(
                    f"AdminSettings.{name} has no setting CLOISTER_ADMIN_{name.upper()}"
                )
        return values

    def proxy_header_options(self) -> dict[str, Any]:
        """uvicorn's options for the X-Forwarded-* headers: believed from the trusted
        proxies only, and from nobody when none is named."""
        trusted = list(self.forwarded_allow_ips)
        return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}

    def _audit_head_path(self) -> Path:
        """Where this data directory keeps its copy of the newest audit checkpoint.

        One file per database (named by a digest of its URL), so that pointing a data
        directory at another database never compares it with the wrong log.
        """
        digest = hashlib.sha256(self.resolved_database_url.encode()).hexdigest()[:16]
        return self.data_dir / f"audit-head-{digest}.json"

    @property
    def resolved_model_roots(self) -> tuple[Path, ...]:
        """Where registered model and adapter sources may live (see `model_roots`)."""
        if self.model_roots is not None:
            return tuple(Path(p).resolve() for p in self.model_roots.split(os.pathsep) if p)
        roots = [self.data_dir / "models", self.data_dir / "adapters"]
        # The bundled model's package, found without importing it (or torch, via the engine).
        spec = importlib.util.find_spec(BUNDLED_MODEL_PACKAGE)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(list(spec.submodule_search_locations)[0]))
        roots.extend(Path(spec.path) for spec in self.served_models if spec.path)
        return tuple(root.resolve() for root in roots)

    def _development_signing_key(self) -> SecretStr:
        """A per-data-directory audit key for development, created once with mode 0600."""
        return SecretStr(read_or_create_secret(self.data_dir / "audit-signing.key"))

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to SQLite inside the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'cloister.db').resolve()}"
