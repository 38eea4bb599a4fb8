"""The model registry as `cloister serve` meets it: the served models recorded at start,
and the gateway's view of the per-model allow-lists, output caps and fallbacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.settings import ModelSpec, Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from gateway.model_access import ModelAccess


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
        read,
        refresh_s=settings.gateway.config_refresh_s,
        read_timeout_s=settings.gateway.auth_read_timeout_s,
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
