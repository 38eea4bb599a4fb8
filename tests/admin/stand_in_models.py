"""Registering the stand-in models the admin tests bill, price and route against."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from admin import registry
from admin.models import RegisteredModel


def register_stand_in(session: Session, name: str, **fields: Any) -> RegisteredModel:
    """Registers `name` as a model no test ever loads: a GGUF at "/m" (nothing opens it)
    with an 8-token context; `fields` are further or replacing keyword arguments of
    `registry.register_model` (prices, now, context_length...)."""
    values: dict[str, Any] = {"source": "/m", "format": "gguf", "context_length": 8}
    return registry.register_model(session, name=name, **{**values, **fields})
