"""The gateway's half of `cloister serve`: an engine client per served model, and the
gateway app over them with its authenticator, limiter and Batch API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from assembly.admin_builder import AdminParts
from assembly.engines import load_engines
from assembly.pools import DatabasePools
from assembly.served_models import registry_model_access
from server.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from engine_hop.client import EngineClient
    from tenancy.key_usage import LastUsedWriter


def engine_clients(
    settings: Settings, engine: Any | None, engine_options: dict[str, Any]
) -> dict[str, EngineClient]:
    """One client per served model: over `settings.gateway.engine_urls` when set (engine
    servers), else over `engine` (a front built by the caller, served as the one model
    `settings.model_name`), else over the engines loaded here."""
    from engine_hop.in_process import InProcessEngineClient

    if settings.gateway.engine_urls and engine is None:
        from assembly.remote_engines import remote_engine_clients

        return remote_engine_clients(settings)
    fronts = (
        load_engines(settings, **engine_options)
        if engine is None
        else {settings.model_name: engine}
    )
    return {name: InProcessEngineClient(front, model_name=name) for name, front in fronts.items()}


def build_gateway(
    settings: Settings,
    clients: dict[str, EngineClient],
    pools: DatabasePools,
    admin: AdminParts,
) -> tuple[FastAPI, LastUsedWriter]:
    """The gateway app over `clients`, and the writer of keys' last use (a background
    writer the caller stops at shutdown)."""
    from admin.deps import operator_auth
    from admin.usage_store import UsageLedger
    from gateway.app import create_app
    from gateway.auth_cache import CachingAuthenticator
    from gateway.batch_api.service import BatchApi
    from tenancy.auth_throttle import FailureThrottle
    from tenancy.authenticator import Authenticator
    from tenancy.key_usage import LastUsedWriter
    from tenancy.limiter import make_limiter

    pepper = settings.key_pepper.get_secret_value()
    last_used = LastUsedWriter(
        pools.writers, interval_s=max(1.0, settings.gateway.config_refresh_s)
    )
    limiter = make_limiter(
        settings.redis_url,
        fail_mode=settings.gateway.limiter_fail_mode,
        local_cap_rpm=settings.gateway.limiter_local_cap_rpm,
        key_prefix=settings.gateway.redis_key_prefix,
        budget_ledger=UsageLedger(pools.writers),
    )
    # One cache (the gateway's): the inner Authenticator keeps none, so the revocation
    # window is config_refresh_s.
    keys = Authenticator(pools.gateway, pepper, refresh_s=0.0, last_used=last_used.start())
    authenticator = CachingAuthenticator(
        keys,
        refresh_s=settings.gateway.config_refresh_s,
        max_stale_s=settings.gateway.auth_max_stale_s,
        read_timeout_s=settings.gateway.auth_read_timeout_s,
        throttle=FailureThrottle(
            limit=settings.auth_failure_limit, window_s=settings.auth_failure_window_s
        ),
        denials=admin.services.audit_writer,
    )
    app = create_app(
        settings,
        engines=clients,
        authenticator=authenticator,
        limiter=limiter,
        usage_sink=admin.metering,
        operator_auth=operator_auth(admin.services),  # who sees the tenant series on /metrics
        model_access=registry_model_access(settings, pools.access),
        # A batch's lines run as the key that created it, re-read (revoked? suspended?)
        # each time the runner takes the batch up.
        batch_api=BatchApi.from_settings(settings, pools.batches, keys.principal_of_key),
    )
    app.state.metering = admin.metering
    return app, last_used
