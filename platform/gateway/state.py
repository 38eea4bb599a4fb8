"""The objects one gateway app owns, bundled once by the lifespan and read by the routes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request
from opentelemetry.trace import Tracer

from engine_hop.client import EngineClient
from gateway.admission import AsyncLimiter
from gateway.auth_cache import AuthenticatorLike, CachingAuthenticator
from gateway.errors import ModelNotFoundError
from gateway.metrics import GatewayMetrics
from gateway.model_access import ModelAccess
from gateway.response_store import ResponseRepository
from gateway.tokenize import PromptTokenizer
from gateway.usage import UsageSink
from server.settings import Settings
from tenancy.unique_ids import UniqueIds

if TYPE_CHECKING:
    from gateway.batch_api.service import BatchApi

__all__ = ["AppState", "AuthenticatorLike", "OperatorAuth", "app_state", "client_host"]

# Whether an Authorization header value belongs to an operator, who may see the
# tenant-labelled metrics. Synchronous (it may read the database); run off the loop.
OperatorAuth = Callable[[str], bool]


@dataclass(frozen=True)
class AppState:
    """Everything a request handler needs; built by `create_app`, never mutated."""

    settings: Settings
    engines: Mapping[str, EngineClient]  # one engine (and cache) per served base model
    auth: CachingAuthenticator  # in-memory answers; database reads off the loop
    limits: AsyncLimiter  # the limiter, awaited on the loop; releases settle in the background
    usage_sink: UsageSink
    metrics: GatewayMetrics
    tracer: Tracer
    started_at: int  # unix time the app started; the `created` of /v1/models
    request_ids: UniqueIds
    tokenize: PromptTokenizer  # prompts size-checked, then encoded off the loop when large
    responses: ResponseRepository  # stored /v1/responses, per tenant, expiring
    operator_auth: OperatorAuth | None = None  # None: tenant metrics are never served
    model_access: ModelAccess | None = None  # the registry's allow-lists; None: none apply
    batch_api: BatchApi | None = None  # files and batches; None: no database, no Batch API

    @property
    def served_models(self) -> tuple[str, ...]:
        """Model names this gateway serves, in the order they were configured."""
        return tuple(self.engines)

    def engine_for(self, model: str) -> EngineClient:
        """The engine serving `model`; 404 model_not_found for a model not served here."""
        engine = self.engines.get(model)
        if engine is None:
            raise ModelNotFoundError(
                f"the model {model!r} does not exist", param="model", code="model_not_found"
            )
        return engine


def app_state(request: Request) -> AppState:
    """The AppState of the app serving `request`."""
    state: AppState = request.app.state.cloister
    return state


def client_host(request: Request) -> str | None:
    """The peer address of `request`: the source bad credentials are counted by."""
    return request.client.host if request.client else None
