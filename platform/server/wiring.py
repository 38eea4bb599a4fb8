"""How `cloister serve` assembles one app: the engine from settings, the gateway over it,
the admin API and console beside it, and what runs at start-up and shutdown.

The CLI's `serve` command only parses flags and runs uvicorn over `build_app`.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.logging_setup import LogFormat
from server.settings import ModelSpec, Settings, private_data_dir

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.orm import Session, sessionmaker

    from engine.llm_engine import LLMEngine
    from gateway.model_access import ModelAccess


class DeviceUnavailableError(ValueError):
    """The `device` setting names a device this machine does not have."""


def prepare_database(settings: Settings) -> bool:
    """Creates the data dir, migrates the database and checks that this process holds the
    secrets it was set up with (`SecretMismatchError` if not); True when it has no tenant
    yet."""
    from sqlalchemy import func, select

    from server.deployment_secrets import check_deployment_secrets
    from tenancy.db import make_engine, make_session_factory, upgrade_database
    from tenancy.models import Tenant

    private_data_dir(settings.data_dir)
    url = settings.resolved_database_url
    upgrade_database(url)
    engine = make_engine(url)
    try:
        check_deployment_secrets(settings, make_session_factory(engine))
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Tenant)).scalar_one()) == 0
    finally:
        engine.dispose()


def resolve_device(requested: str, *, cuda_available: bool | None = None) -> str:
    """ "cpu" or "cuda" for the `device` setting; "cuda" without a GPU is refused."""
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise DeviceUnavailableError("device is 'cuda' but no CUDA GPU is available here")
    return requested


def resolve_dtype(requested: str, device: str) -> str:
    """The `dtype` setting on `device`: "auto" is bfloat16 on CUDA and float32 elsewhere."""
    if requested == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    return requested


def resolve_fused_ops_setting(requested: str, device: str) -> str:
    """The `fused_ops` setting on `device`; "on" needs CUDA (the server runs no interpreter)."""
    if requested == "on" and device != "cuda":
        raise DeviceUnavailableError(
            f"fused_ops is 'on' but the device is {device!r}: the fused kernels need CUDA"
        )
    return requested


def resolve_weight_quant_setting(requested: str, device: str) -> str:
    """The `weight_quant` setting on `device`; int8/int4 kernels are the CPU's only.

    "auto" is "none" off the CPU; on it, each engine resolves it from its own model file
    (engine.model.quant.choose_weight_quant), since served models may differ."""
    if requested == "auto":
        return "auto" if device == "cpu" else "none"
    if requested != "none" and device != "cpu":
        raise DeviceUnavailableError(
            f"weight_quant is {requested!r} but the device is {device!r}: it runs on the CPU only"
        )
    return requested


def check_model_files(settings: Settings) -> None:
    """Reads each served model's metadata (config.json or the GGUF header), so that a
    missing, unknown or absurd model stops `cloister serve` with the file's name before
    anything is made; raises UnsupportedModelError."""
    from engine.errors import UnsupportedModelError
    from engine.model.loader import default_model_path
    from engine.planning.model_source import read_model_architecture

    for spec in settings.served_models:
        path = spec.path or default_model_path()
        try:
            read_model_architecture(path)
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"model {spec.name!r} ({path}): {exc}") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            detail = f"{type(exc).__name__}: {exc}"
            raise UnsupportedModelError(f"model {spec.name!r} ({path}): {detail}") from None


def serve_engine_options(
    settings: Settings, *, cuda_available: bool | None = None
) -> dict[str, Any]:
    """The engine options `cloister serve` derives from its settings (besides the model).

    On CUDA, "auto" attention is triton and "auto" fused ops are on (the engine's own
    choices for the device); CUDA graphs are captured unless enforce_eager.
    """
    device = resolve_device(settings.device, cuda_available=cuda_available)
    return {
        "device": device,
        "dtype": resolve_dtype(settings.dtype, device),
        "weight_quant": resolve_weight_quant_setting(settings.weight_quant, device),
        "cpu_packed_linears": settings.cpu_packed_linears,
        "max_model_len": settings.max_model_len,
        "enforce_eager": settings.enforce_eager,
        "kv_cache_bytes": settings.kv_cache_bytes,
        "kv_host_bytes": settings.kv_host_bytes,
        "kv_disk_path": settings.kv_disk_path,
        "kv_disk_bytes": settings.kv_disk_bytes,
        "speculative_method": settings.speculative_method,
        "num_speculative_tokens": settings.num_speculative_tokens,
        "speculative_model": settings.speculative_model,
        "speculative_max_batch": settings.speculative_max_batch,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "block_size": settings.block_size,
        "prefix_cache": settings.prefix_cache,
        "min_cached_blocks": settings.min_cached_blocks,
        "min_cached_share": settings.min_cached_share,
        "fair_cached_share": settings.fair_cached_share,
        "kv_shares": settings.kv_shares,
        "grammar_compile_timeout_s": settings.grammar_compile_timeout_s,
        "grammar_mask_budget_s": settings.grammar_mask_budget_s,
        "strict_partition": settings.strict_partition,
        "retention_ttl_s": settings.retention_ttl_s,
        "scrub_freed_blocks": settings.scrub_freed_blocks,
        "max_num_seqs": settings.max_num_seqs,
        "max_loras": settings.max_loras,
        "max_cpu_loras": settings.max_cpu_loras,
        "max_lora_rank": settings.max_lora_rank,
        "lora_kernel": settings.lora_kernel,
        "lora_slot_quantum": settings.lora_slot_quantum,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "prefill_chunk_size": settings.prefill_chunk_size,
        "itl_budget_ms": settings.itl_budget_ms,
        "kv_events_endpoint": settings.kv_events_endpoint,
        "kv_events_topic": kv_events_topic(settings, settings.served_models[0].name),
        "kv_events_replay_endpoint": settings.kv_events_replay_endpoint,
        "kv_events_buffer_steps": settings.kv_events_buffer_steps,
        "max_waiting": settings.max_waiting,
        "max_n": settings.max_n,
        "scheduling_policy": settings.scheduling_policy,
        "attention_backend": settings.attention_backend,
        "fused_ops": resolve_fused_ops_setting(settings.fused_ops, device),
    }


def kv_events_topic(settings: Settings, model_name: str) -> str:
    """The topic of a model's KV events: the setting, else llm-d's kv@<host>@<model>."""
    if settings.kv_events_topic:
        return settings.kv_events_topic
    return f"kv@{socket.gethostname()}@{model_name}"


def load_engine(
    settings: Settings,
    *,
    factory: Callable[[], LLMEngine] | None = None,
    model: str | None = None,
    **engine_options: Any,
) -> Any:
    """The engine front `settings.engine_mode` asks for.

    "thread": an AsyncEngine whose loop is a thread of this process; "process": a
    ProcessEngine whose loop is a child process (this call waits for it to be ready).
    The engine is `factory()` (picklable, for the child) when given, else `model`
    (None: `settings.model`) with the serve options and `engine_options`.
    """
    options = {**serve_engine_options(settings), **engine_options}
    path = model if model is not None else settings.model
    if settings.engine_mode == "process":
        from engine.process_engine import ProcessEngine

        return ProcessEngine(
            factory
            or functools.partial(
                build_engine_in_child,
                settings.log_level,
                path,
                options,
                log_format=settings.log_format,
            )
        )
    from engine.async_engine import AsyncEngine
    from engine.scratch_thread import run_on_scratch_thread

    progress = shows_progress(settings.log_format)
    # Built off this thread: the engine steps on a thread of its own (see scratch_thread).
    built = run_on_scratch_thread(
        factory or functools.partial(build_engine, path, options, progress=progress)
    )
    return AsyncEngine(built)


def shows_progress(log_format: str) -> bool:
    """Whether model loading draws a progress bar: on a terminal, unless logs are JSON."""
    from server.logging_setup import is_terminal

    return log_format != "json" and is_terminal(sys.stderr)


def build_engine(model: str | None, options: dict[str, Any], *, progress: bool) -> LLMEngine:
    """`LLMEngine.from_options(model, **options)`, with a progress bar over the weights
    when `progress`."""
    import torch

    from engine.llm_engine import LLMEngine, build_config
    from engine.model.loader import load_model

    config = build_config(model, **options)
    loaded = load_model(
        config.model.path or None,
        dtype=config.model.dtype,
        device=torch.device(config.model.device),
        progress=progress,
    )
    return LLMEngine(config, loaded)


def load_engines(settings: Settings, **engine_options: Any) -> dict[str, Any]:
    """One engine front per served model (`settings.served_models`), in order, each with
    the same options and its own KV pool and prefix cache.

    On CUDA, without an explicit `kv_cache_bytes`, the models share
    `gpu_memory_utilization`: each engine sizes its pool after measuring what the ones
    loaded before it hold, so engine i of n is allowed (i + 1) / n of the share, and
    each ends with about an equal part. If one fails to load, those already loaded stop.
    """
    specs = settings.served_models
    engines: dict[str, Any] = {}
    try:
        for i, spec in enumerate(specs):
            options = dict(engine_options)
            if settings.kv_events_endpoint is not None:  # each model's events on its topic
                options.setdefault("kv_events_topic", kv_events_topic(settings, spec.name))
            if len(specs) > 1 and "gpu_memory_utilization" not in options:
                options["gpu_memory_utilization"] = (
                    settings.gpu_memory_utilization * (i + 1) / len(specs)
                )
            engines[spec.name] = load_engine(settings, model=spec.path, **options)
    except BaseException:
        for engine in engines.values():
            _stop_unstarted(engine)
        raise
    return engines


def _stop_unstarted(engine: Any) -> None:
    """Stops an engine front `build_app` will not serve (a later model failed to load)."""
    import asyncio

    try:
        asyncio.run(engine.shutdown())
    except Exception:  # best effort: the start-up error is the one to report
        import logging

        logging.getLogger("cloister.serve").exception("stopping a loaded engine failed")


def build_engine_in_child(
    log_level: str,
    model: str | None,
    options: dict[str, Any],
    *,
    log_format: LogFormat = "auto",
) -> LLMEngine:
    """The engine process's factory: the server's log format, then the model."""
    from server.logging_setup import configure_logging

    configure_logging(log_level, fmt=log_format)
    return build_engine(model, options, progress=shows_progress(log_format))


def build_app(settings: Settings, *, engine: Any | None = None, **engine_options: Any) -> FastAPI:
    """The wired gateway: authenticator on the database, limiter from settings, engines
    in-process.

    `engine` may be an already built engine front (tests, benchmarks), served as the one
    model `settings.model_name`; otherwise one engine per `settings.served_models` is
    loaded (the default: the bundled SmolLM2) with `engine_options`, each on a thread or
    in a child process as `settings.engine_mode` says, and recorded in the registry.
    """
    from gateway.app import create_app
    from gateway.auth_cache import READ_THREADS, CachingAuthenticator
    from gateway.batch_api.service import BatchApi
    from gateway.engine_client import InProcessEngineClient
    from tenancy.auth_throttle import FailureThrottle
    from tenancy.authenticator import Authenticator
    from tenancy.db import make_engine, make_session_factory
    from tenancy.key_usage import LastUsedWriter
    from tenancy.limiter import make_limiter

    # A given engine (tests, benchmarks) or remote engines: no model file is loaded here.
    loads_model = engine is None and not settings.engine_urls
    clients: dict[str, Any]
    if settings.engine_urls and engine is None:
        from server.remote_engines import remote_engine_clients

        clients = remote_engine_clients(settings)
    else:
        fronts = (
            load_engines(settings, **engine_options)
            if engine is None
            else {settings.model_name: engine}
        )
        clients = {
            name: InProcessEngineClient(front, model_name=name) for name, front in fronts.items()
        }
    resolved = {**serve_engine_options(settings), **engine_options} if loads_model else {}
    url = settings.resolved_database_url
    timeout_ms = int(settings.auth_read_timeout_s * 1000)
    # Three pools, so tenant traffic never waits on the admin API's database use: the
    # gateway's key reads (one connection per read thread), the admin API's requests,
    # and the background writers (audit, metering, last_used_at).
    gateway_sessions = make_session_factory(
        make_engine(
            url,
            pool_size=READ_THREADS,
            max_overflow=0,
            pool_timeout_s=settings.auth_read_timeout_s,
            statement_timeout_ms=timeout_ms,
        )
    )
    sessions = make_session_factory(
        make_engine(url, pool_size=settings.db_pool_size, max_overflow=settings.db_pool_size)
    )
    writer_sessions = make_session_factory(make_engine(url, pool_size=3, max_overflow=2))
    # The registry's allow-lists, read by the gateway on its own thread and connection.
    # Made with the others, before any connection is open: on SQLite, make_engine opens
    # and closes the file, which would drop the process's locks held by open connections.
    access_sessions = make_session_factory(
        make_engine(
            url,
            pool_size=1,
            max_overflow=0,
            pool_timeout_s=settings.auth_read_timeout_s,
            statement_timeout_ms=timeout_ms,
        )
    )
    # The Batch API's files, batches and line results: its own pool, so a batch's
    # bookkeeping never waits on (or holds up) key reads or the admin API.
    batch_sessions = make_session_factory(make_engine(url, pool_size=4, max_overflow=4))
    pepper = settings.key_pepper.get_secret_value()
    last_used = LastUsedWriter(writer_sessions, interval_s=max(1.0, settings.config_refresh_s))
    from admin.app import make_services
    from admin.deps import operator_auth
    from admin.metering import MeteringSink
    from admin.openapi import install_admin_openapi
    from admin.router import create_admin_router
    from admin.ui import (
        gateway_adapter_runtime,
        gateway_engine_replicas,
        gateway_engine_stats,
        mount_console,
    )
    from admin.usage_store import UsageLedger

    admin_settings = settings.admin_settings()
    services = make_services(
        sessions, pepper=pepper, settings=admin_settings, audit_sessions=writer_sessions
    )
    # Started first: it replays a spool left by a killed process into the ledger, from
    # which the limiter seeds its budget counters.
    metering = MeteringSink(writer_sessions, admin_settings.spool_path).start()
    limiter = make_limiter(
        settings.redis_url,
        fail_mode=settings.limiter_fail_mode,
        local_cap_rpm=settings.limiter_local_cap_rpm,
        key_prefix=settings.redis_key_prefix,
        budget_ledger=UsageLedger(writer_sessions),
    )
    # One cache (the gateway's): the inner Authenticator keeps none, so the revocation
    # window is config_refresh_s.
    keys = Authenticator(gateway_sessions, pepper, refresh_s=0.0, last_used=last_used.start())
    authenticator = CachingAuthenticator(
        keys,
        refresh_s=settings.config_refresh_s,
        max_stale_s=settings.auth_max_stale_s,
        read_timeout_s=settings.auth_read_timeout_s,
        throttle=FailureThrottle(
            limit=settings.auth_failure_limit, window_s=settings.auth_failure_window_s
        ),
        denials=services.audit_writer,
    )
    if engine is None:  # before the allow-lists are first read: it may register the model
        # Over engine servers too (the gateway reads the same model files for its
        # tokenizer), so adapters can name the base at once; each replica reports its
        # own device and dtype (the Engines view), so the registry names none then.
        record_served_models(
            services,
            [(spec, clients[spec.name].max_model_len) for spec in settings.served_models],
            device=str(resolved["device"]) if loads_model else None,
            dtype=str(resolved["dtype"]) if loads_model else None,
        )
    app = create_app(
        settings,
        engines=clients,
        authenticator=authenticator,
        limiter=limiter,
        usage_sink=metering,
        operator_auth=operator_auth(services),  # who sees the tenant series on /metrics
        model_access=registry_model_access(settings, access_sessions),
        # A batch's lines run as the key that created it, re-read (revoked? suspended?)
        # each time the runner takes the batch up.
        batch_api=BatchApi.from_settings(settings, batch_sessions, keys.principal_of_key),
    )
    # One process serves the admin API and its console next to the gateway.
    app.include_router(create_admin_router(services))
    mount_console(
        app,
        services,
        engine_stats=gateway_engine_stats(app.state.cloister),
        engine_replicas=gateway_engine_replicas(app.state.cloister),
        adapter_runtime=gateway_adapter_runtime(app.state.cloister),
    )
    install_admin_openapi(app)  # the admin API's own document, apart from the tenant API's
    app.state.metering = metering
    app.state.admin_services = services  # run_server runs its audit checkpoint timer
    # Tenant cache policies and published prefixes reach each running engine within
    # config_refresh_s, like limits; read on the background writers' pool. One sync per
    # model: a published prefix belongs to one model and is tokenized by its tokenizer.
    from server.cache_rules_sync import CacheRulesSync
    from server.periodic_sync import run_while_serving

    app.state.cache_rules_syncs = {
        name: CacheRulesSync(client, writer_sessions, interval_s=settings.config_refresh_s)
        for name, client in clients.items()
    }
    for sync in app.state.cache_rules_syncs.values():
        run_while_serving(app, sync)
    # Registered adapters are loaded (retired ones unloaded) within config_refresh_s.
    from server.adapter_sync import AdapterSync

    app.state.adapter_syncs = {
        name: AdapterSync(client, writer_sessions, interval_s=settings.config_refresh_s)
        for name, client in clients.items()
    }
    for adapter_sync in app.state.adapter_syncs.values():
        run_while_serving(app, adapter_sync)
    app.state.background_writers = (last_used, services.audit_writer)
    with_server_logs(app, settings, engine_options=resolved)
    return app


def with_server_logs(
    app: FastAPI, settings: Settings, *, engine_options: dict[str, Any] | None = None
) -> None:
    """Once the app's engines started: logs the start-up summary (once), then an engine
    line every `settings.engine_log_interval_s` (0: none) until the app stops."""
    import asyncio
    import logging

    from server.engine_stats_log import EngineStatsLogger
    from server.startup_summary import build_summary, log_summary

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            engines = a.state.cloister.engines
            try:
                log_summary(build_summary(settings, engines, engine_options or {}))
            except Exception:  # a summary never keeps a server from serving
                logging.getLogger("cloister.serve").exception("start-up summary failed")
            task = None
            if settings.engine_log_interval_s > 0:
                stats_log = EngineStatsLogger(engines, settings.engine_log_interval_s)
                task = asyncio.create_task(stats_log.run(), name="engine-stats-log")
            try:
                yield
            finally:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    app.router.lifespan_context = lifespan


def registry_model_access(settings: Settings, sessions: sessionmaker[Session]) -> ModelAccess:
    """The gateway's view of the registry's per-model tenant allow-lists, output caps and
    overload fallbacks, read once now and then every `config_refresh_s` on its own thread
    (and `sessions`' connection)."""
    from admin import registry
    from gateway.model_access import ModelAccess, RegistryView

    def read() -> RegistryView:
        with sessions() as session:
            # Adapters as "base:adapter" entries: their owner (None: public).
            allowed = {**registry.allow_lists(session), **registry.adapter_allow_lists(session)}
            return RegistryView(allowed, registry.output_caps(session), registry.fallbacks(session))

    return ModelAccess.load(
        read, refresh_s=settings.config_refresh_s, read_timeout_s=settings.auth_read_timeout_s
    )


def record_served_models(
    services: Any,
    models: list[tuple[ModelSpec, int]],
    *,
    device: str | None = None,
    dtype: str | None = None,
) -> None:
    """Records the loaded models (each with its context length) in the registry, status
    `loaded`, on `device` in `dtype`; warns for each without a price, since its usage
    would be billed at $0 (and marked unpriced)."""
    import datetime as dt
    import logging

    from admin import registry
    from admin.served_models import describe, record_served
    from engine.errors import UnsupportedModelError
    from engine.model.loader import default_model_path
    from engine.planning.model_source import read_model_facts

    served = []
    for spec, context_length in models:
        path = Path(spec.path or default_model_path())
        try:
            facts = read_model_facts(path)
        except (UnsupportedModelError, OSError, ValueError):
            facts = None  # an engine server's own copy may differ; the row names none then
        served.append(
            describe(
                spec.name,
                path,
                context_length,
                device=device,
                dtype=dtype,
                family=facts.family if facts else None,
                quantization=facts.quantization if facts else None,
            )
        )
    record_served(services.sessions, services.audit_writer, *served)
    for one in served:
        with services.sessions() as session:
            prices = registry.price_in_force(session, model=one.name, when=dt.datetime.now(dt.UTC))
        if prices is None:  # a price of 0 is a deliberate choice, not a missing price
            logging.getLogger("cloister.serve").warning(
                "model %r has no price: its usage is billed at $0 and marked unpriced until "
                "one is set (POST /admin/api/v1/models/%s/prices)",
                one.name,
                one.name,
            )


def close_at_shutdown(app: FastAPI, *closers: Callable[[], None]) -> None:
    """Runs `closers` in order, off the event loop, once the app's lifespan has ended."""
    from starlette.concurrency import run_in_threadpool

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            yield
        for close in closers:
            await run_in_threadpool(close)

    app.router.lifespan_context = lifespan
