"""Registered models and their prices: register, update, price, and the public views."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, StrictInt

from admin import registry
from admin.schemas.common import IsoTime


class ModelCreate(BaseModel):
    """A model to register; prices in micro-USD per million tokens.

    With no price at all the model is unpriced (its usage is billed $0 and marked
    unpriced) until one is set; a price given in part is 0 for the parts left out.
    `allowed_tenants` are tenant ids (None: every tenant).
    """

    name: str
    source: str
    format: str
    context_length: int
    revision: str = "main"
    input_price: int | None = None
    cached_input_price: int | None = None
    output_price: int | None = None
    allowed_tenants: list[str] | None = None

    def prices(self) -> registry.Prices | None:
        """The first price, or None for an unpriced model."""
        given = (self.input_price, self.cached_input_price, self.output_price)
        if all(p is None for p in given):
            return None
        return registry.Prices(*(p or 0 for p in given))


class ModelUpdate(BaseModel):
    """A status, allow-list (tenant ids) or output cap change.

    `max_output_tokens`: absent keeps it, null clears it (the model's context length caps
    output), else 1 to 10**7 and at most the model's context length.
    """

    status: str | None = None
    allowed_tenants: list[str] | None = None
    clear_allowed_tenants: bool = False
    max_output_tokens: StrictInt | None = None


class PriceCreate(BaseModel):
    """A new price, effective from a time (default now)."""

    input_price: int
    cached_input_price: int
    output_price: int
    effective_from: dt.datetime | None = None
    # One of the model's adapters: its own price (without one it is billed at the model's).
    adapter: str | None = None


class PricePublic(BaseModel):
    """One price of a model (micro-USD per million tokens) from `effective_from` on."""

    effective_from: IsoTime | None
    input_price: int
    cached_input_price: int
    output_price: int
    adapter: str | None = None  # an adapter's own price; None: the model's


class ModelPublic(BaseModel):
    """A model with its current price (None: unpriced)."""

    id: str
    name: str
    revision: str
    source: str
    format: str
    context_length: int
    status: str
    allowed_tenants: list[str] | None  # tenant ids; None: every tenant
    device: str | None  # where the server that loaded it runs it; None unless loaded
    dtype: str | None
    # The most output tokens one request may ask for (None: the context length).
    max_output_tokens: int | None
    family: str | None  # "qwen3", "llama", ...: as the server that loaded it read it
    quantization: str | None  # "Q4_K+Q6_K", "BF16", ...: how its matrices are stored
    created_at: IsoTime | None
    price: PricePublic | None


class ModelDetail(ModelPublic):
    """A model with its whole price history (oldest first)."""

    price_history: list[PricePublic]
