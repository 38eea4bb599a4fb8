"""The objects one gateway app owns, bundled once by the lifespan and read by the routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cloister.settings import Settings
from fastapi import Request
from opentelemetry.trace import Tracer

from gateway.engine_client import EngineClient
from gateway.metrics import GatewayMetrics
from gateway.usage import UsageSink
from tenancy.limiter.base import Limiter
from tenancy.principal import Principal


class AuthenticatorLike(Protocol):
    """Bearer credential -> Principal; raises tenancy's AuthenticationError."""

    def authenticate(self, bearer: str | None) -> Principal:
        """The principal behind the Authorization header value (or the bare token)."""
        ...


@dataclass(frozen=True)
class AppState:
    """Everything a request handler needs; built by `create_app`, never mutated."""

    settings: Settings
    engine: EngineClient
    authenticator: AuthenticatorLike
    limiter: Limiter
    usage_sink: UsageSink
    metrics: GatewayMetrics
    tracer: Tracer
    started_at: int  # unix time the app started; the `created` of /v1/models

    @property
    def served_models(self) -> tuple[str, ...]:
        """Model names this gateway serves (adapters join here with the LoRA issue)."""
        return (self.engine.model_name,)


def app_state(request: Request) -> AppState:
    """The AppState of the app serving `request`."""
    state: AppState = request.app.state.cloister
    return state
