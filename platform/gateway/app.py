"""The gateway's FastAPI app: routes, error mapping, and a lifespan owning its objects."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import MappingProxyType

from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider

from engine_hop.client import EngineClient
from gateway.admission import AsyncLimiter
from gateway.auth_cache import CachingAuthenticator
from gateway.batch_api.service import BatchApi
from gateway.errors import install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.model_access import ModelAccess
from gateway.openapi import install_openapi
from gateway.response_store import InMemoryResponses, ResponseRepository, ResponseStore
from gateway.response_store_redis import RedisResponses
from gateway.routes import batches, chat, completions, files, metrics, models, responses
from gateway.state import AppState, AuthenticatorLike, OperatorAuth
from gateway.tokenize import PromptTokenizer
from gateway.tracing import gateway_tracer
from gateway.usage import LoggingUsageSink, UsageSink
from server.request_ids import install_request_ids
from server.settings import Settings
from server.telemetry import provider_from_settings
from tenancy.limiter.base import Limiter
from tenancy.unique_ids import UniqueIds

logger = logging.getLogger("cloister.gateway")


def response_repository(settings: Settings) -> ResponseRepository:
    """Stored responses: shared in Redis when gateways share one (`responses_store` auto
    or redis), else in this process's memory."""
    if settings.responses.store == "redis" or (
        settings.responses.store == "auto" and settings.redis_url is not None
    ):
        assert settings.redis_url is not None, "Settings refuses redis without a URL"
        return RedisResponses.from_url(
            settings.redis_url,
            ttl_s=settings.responses.ttl_s,
            max_per_tenant=settings.responses.max_per_tenant,
            max_record_bytes=settings.responses.max_record_bytes,
            max_bytes_per_tenant=settings.responses.max_bytes_per_tenant,
            key_prefix=settings.responses.key_prefix,
        )
    return InMemoryResponses(
        ResponseStore(
            ttl_s=settings.responses.ttl_s,
            max_entries=settings.responses.max_entries,
            max_per_tenant=settings.responses.max_per_tenant,
            max_bytes=settings.responses.max_chars,
            max_bytes_per_tenant=settings.responses.max_bytes_per_tenant,
            max_record_bytes=settings.responses.max_record_bytes,
        )
    )


def create_app(
    settings: Settings,
    *,
    engine_client: EngineClient | None = None,
    engines: Mapping[str, EngineClient] | None = None,
    authenticator: AuthenticatorLike | CachingAuthenticator,
    limiter: Limiter,
    usage_sink: UsageSink | None = None,
    tracer_provider: TracerProvider | None = None,
    manage_engine: bool = True,
    operator_auth: OperatorAuth | None = None,
    model_access: ModelAccess | None = None,
    batch_api: BatchApi | None = None,
) -> FastAPI:
    """An app serving the OpenAI-compatible API over its engines.

    Give `engines` (model name -> its engine; requests go to the engine of their
    `model`) or `engine_client` alone (one model, under its `model_name`), not both.
    The lifespan starts the engines (when `manage_engine`) and shuts them and the
    tracer provider down on exit. Nothing lives in module globals: two apps in one
    process (tests, benchmarks) share nothing. `operator_auth` decides who sees the
    tenant-labelled series on /metrics (None: nobody); `model_access` holds the
    registry's per-model tenant allow-lists (None: only keys and tenant limits restrict
    models). `batch_api` serves /v1/files and /v1/batches, its runner running while the
    app serves (None: those routes answer 404). `authenticator` is wrapped in the gateway's key cache unless it already is
    one (then it is used as it is).
    """
    served = _served_engines(engine_client, engines)
    provider = tracer_provider or provider_from_settings(settings, role="gateway")
    state = AppState(
        settings=settings,
        engines=served,
        auth=authenticator
        if isinstance(authenticator, CachingAuthenticator)
        else CachingAuthenticator(authenticator, refresh_s=settings.gateway.config_refresh_s),
        limits=AsyncLimiter(
            limiter,
            concurrency_mode=settings.gateway.concurrency_mode,
            queue_timeout_s=settings.gateway.concurrency_queue_timeout_s,
        ),
        usage_sink=usage_sink or LoggingUsageSink(),
        metrics=GatewayMetrics(
            model_name=next(iter(served)), top_tenants=settings.telemetry.metrics_top_tenants
        ),
        tracer=gateway_tracer(provider),
        started_at=int(time.time()),
        request_ids=UniqueIds(),
        tokenize=PromptTokenizer(),
        responses=response_repository(settings),
        operator_auth=operator_auth,
        model_access=model_access,
        batch_api=batch_api,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started: list[EngineClient] = []
        try:
            if manage_engine:
                for client in served.values():
                    await client.start()
                    started.append(client)
            if batch_api is not None:  # after the engines: it resumes unfinished batches
                await batch_api.runner.start()
            yield
        finally:
            if batch_api is not None:
                await batch_api.runner.stop()
            await state.limits.close()
            await state.responses.close()
            await state.auth.drain()
            state.tokenize.close()
            if model_access is not None:
                model_access.close()
            # All at once: an engine process takes seconds to exit, and one failing to stop
            # does not keep the others running.
            results = await asyncio.gather(
                *(client.shutdown() for client in started), return_exceptions=True
            )
            for client, result in zip(started, results, strict=True):
                if isinstance(result, BaseException):
                    logger.error(
                        "engine shutdown failed",
                        exc_info=result,
                        extra={"model": client.model_name},
                    )
            provider.shutdown()

    app = FastAPI(title="Cloister", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.cloister = state
    install_error_handlers(app)
    for module in (chat, completions, responses, models, metrics, files, batches):
        app.router.routes.extend(module.routes)
    if batch_api is not None:
        batch_api.runner.attach(app)
    install_openapi(app)
    # Every response names its request (x-request-id), 500s and the admin routes included.
    install_request_ids(app, lambda: state.request_ids.next("req"))
    return app


def _served_engines(
    engine_client: EngineClient | None, engines: Mapping[str, EngineClient] | None
) -> Mapping[str, EngineClient]:
    """The read-only model name -> engine map of `create_app`'s two ways of giving it."""
    if engines is not None and engine_client is None:
        served = dict(engines)
    elif engine_client is not None and engines is None:
        served = {engine_client.model_name: engine_client}
    else:
        raise ValueError("give engine_client or engines, exactly one of them")
    if not served:
        raise ValueError("engines is empty: a gateway serves at least one model")
    return MappingProxyType(served)
