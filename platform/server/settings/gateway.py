"""The gateway's settings (`settings.gateway`; CLOISTER_GATEWAY__NAME or CLOISTER_NAME):
limits, the key cache, the engines it sends to, tool and reasoning parsers, the Batch API
and its file store."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

ENGINE_URL_SCHEMES = ("http://", "https://", "dns+http://")


def _names_a_model(entry: str) -> bool:
    """Whether an engine URL entry is NAME=URL (the name part holds no scheme)."""
    head, sep, _ = entry.partition("=")
    return bool(sep) and "://" not in head


def engine_url_groups(entries: tuple[str, ...], models: tuple[str, ...]) -> dict[str, list[str]]:
    """model name -> its engine URLs: NAME=URL entries, or plain URLs for the one model."""
    named = [_names_a_model(e) for e in entries]
    if not any(named):
        if len(models) != 1:
            raise ValueError("with several models, give each engine URL as NAME=URL")
        return {models[0]: list(entries)}
    if not all(named):
        raise ValueError("give every engine URL as NAME=URL, or none")
    groups: dict[str, list[str]] = {}
    for entry in entries:
        name, _, url = entry.partition("=")
        groups.setdefault(name.strip(), []).append(url.strip())
    if set(groups) != set(models):
        raise ValueError(
            f"engine URLs name {sorted(groups)}, but the served models are {sorted(models)}"
        )
    return groups


class GatewaySettings(BaseModel):
    """What the OpenAI-compatible gateway reads besides the settings both services share."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_key_prefix: str = "cloister:lim:"  # gateways sharing limits share the prefix
    # While Redis cannot answer: open (local caps) or closed (503).
    limiter_fail_mode: Literal["open", "closed"] = "open"
    limiter_local_cap_rpm: int = 600  # per-process cap applied while Redis is unreachable
    # A request over its concurrency limit: "reject" (429 at once) or "queue" (wait for a
    # slot up to concurrency_queue_timeout_s, then 429).
    concurrency_mode: Literal["reject", "queue"] = "reject"
    # How long a queued request waits for a slot.
    concurrency_queue_timeout_s: float = Field(default=30.0, ge=0.0)
    config_refresh_s: float = 2.0  # how stale tenant/key/limit data may be on a running server
    # While the database cannot answer, keys seen within config_refresh_s + this are still
    # served from the gateway's cache; anything else gets 503 with Retry-After.
    auth_max_stale_s: float = Field(default=300.0, ge=0.0)
    auth_read_timeout_s: float = Field(default=2.0, gt=0.0)  # one key read, before falling back
    # Engine servers (`cloister engine serve`) the gateway uses instead of an in-process
    # engine, comma-separated: http://host:port, or dns+http://name:port for a headless
    # Service whose addresses are re-resolved. Empty: the engine runs in this process.
    engine_urls: Annotated[tuple[str, ...], NoDecode] = ()
    # How a gateway picks one of several engine replicas (engine_hop/routing.py):
    # prefix_affine (cache root + first blocks, with a load escape), session (the
    # cache root + the `user` hash, else the first block) or round_robin.
    router_policy: Literal["prefix_affine", "session", "round_robin"] = "prefix_affine"
    # How completions travel to engine servers: "link", one WebSocket per engine server
    # carrying all requests (the lower latency), or "http", one request each, which a
    # Kubernetes Gateway in front of an InferencePool needs to pick a replica per request.
    engine_transport: Literal["link", "http"] = "link"
    # The longest a gateway waits for a request's next event from an engine server (a
    # stuck engine): then the request fails as the engine's, and the replica counts a
    # failed poll. A request queued in a busy engine hears nothing either: keep it long.
    engine_read_timeout_s: float = Field(default=600.0, gt=0.0, le=86_400.0, allow_inf_nan=False)
    # How tool calls are written and parsed: auto picks the format from the chat
    # template; none refuses requests with tools.
    tool_parser: Literal["auto", "hermes", "llama3_json", "smollm2", "mistral", "none"] = "auto"
    # A reasoning model's <think> block returned as reasoning_content, apart from the
    # content (gateway.reasoning): auto when the chat template writes <think>.
    reasoning_parser: Literal["auto", "qwen3", "none"] = "auto"
    # The Batch API (/v1/files, /v1/batches). Files live under <data_dir>/files. OpenAI's
    # own caps are 200 MB and 50,000 lines per input file.
    batch_max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1024)
    # Lines per batch input file.
    batch_max_file_lines: int = Field(default=50_000, ge=1)
    # Files one tenant may keep.
    batch_max_files_per_tenant: int = Field(default=500, ge=1)
    # Bytes of files one tenant may keep.
    batch_max_bytes_per_tenant: int = Field(default=2 * 1024 * 1024 * 1024, ge=1024)
    # A tenant's batch token budget: the estimated tokens (prompt bytes / 4 plus each
    # line's output cap) of its batches not yet finished; a batch over it is refused.
    batch_max_queued_tokens: int = Field(default=50_000_000, ge=1)
    batch_concurrency: int = Field(default=8, ge=1, le=1024)  # lines in flight, all tenants
    # How long a gateway's claim on a batch lasts unrenewed: after a crash, another gateway
    # (or this one, restarted) takes the batch up once it lapses.
    batch_lease_s: float = Field(default=30.0, ge=5.0, le=3600.0, allow_inf_nan=False)
    # The files' bodies in an S3-compatible bucket (AWS, MinIO, Ceph...) under
    # <prefix>/<tenant>/<file id>, so several gateways share them; empty: <data_dir>/files.
    # Credentials: the two keys below, else boto3's chain (AWS_ACCESS_KEY_ID, a role).
    files_s3_bucket: str = ""
    files_s3_endpoint_url: str | None = None  # None: AWS itself
    # The bucket's region (unset: boto3's).
    files_s3_region: str | None = None
    # The key prefix under which each tenant's files go.
    files_s3_prefix: str = "cloister-files"
    # Unset: boto3's credential chain.
    files_s3_access_key_id: str | None = None
    # Given with files_s3_access_key_id.
    files_s3_secret_access_key: SecretStr | None = None
    # One call to the bucket, at most.
    files_s3_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0, allow_inf_nan=False)

    @field_validator("engine_urls", mode="before")
    @classmethod
    def _parse_engine_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        for entry in value or ():
            url = (
                entry.split("=", 1)[1]
                if isinstance(entry, str) and _names_a_model(entry)
                else entry
            )
            if not isinstance(url, str) or not url.startswith(ENGINE_URL_SCHEMES):
                raise ValueError(
                    "an engine URL is [NAME=]http(s)://host:port or [NAME=]dns+http://name:port, "
                    f"not {entry!r}"
                )
        return tuple(value or ())

    @field_validator("files_s3_bucket")
    @classmethod
    def _check_files_s3_bucket(cls, value: str) -> str:
        """A bucket name, or empty."""
        from server.file_store_settings import check_bucket

        return check_bucket(value)

    @field_validator("files_s3_endpoint_url")
    @classmethod
    def _check_files_s3_endpoint_url(cls, value: str | None) -> str | None:
        """An http(s) URL without credentials, or None."""
        from server.file_store_settings import check_endpoint_url

        return check_endpoint_url(value)

    @field_validator("files_s3_prefix")
    @classmethod
    def _check_files_s3_prefix(cls, value: str) -> str:
        """Safe key path segments."""
        from server.file_store_settings import check_prefix

        return check_prefix(value)

    @model_validator(mode="after")
    def _check_files_s3_combination(self) -> GatewaySettings:
        from server.file_store_settings import check_combination

        secret = self.files_s3_secret_access_key
        check_combination(
            self.files_s3_bucket,
            self.files_s3_endpoint_url,
            self.files_s3_access_key_id or None,
            bool(secret and secret.get_secret_value()),
        )
        return self
