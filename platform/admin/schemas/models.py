"""Registered models and their prices: register, update, price, and the public views."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, Field, StrictInt, ValidationInfo, field_validator

from admin import registry
from admin.models import DEFAULT_BATCH_DISCOUNT_PCT
from admin.schemas.common import IsoTime

# A batch line's discount in percent of its price: a whole number from 0 to 100, so a
# bad one ("x", 101, 12.5) is a 400 naming the field rather than a rounded price.
BatchDiscount = Annotated[StrictInt, Field(ge=0, le=100)]


class ModelCreate(BaseModel):
    """A model to register; prices in micro-USD per million tokens.

    With no price at all the model is unpriced (its usage is billed $0 and marked
    unpriced) until one is set; a price given in part is 0 for the parts left out.
    `batch_discount_pct` is part of the price (default 50), so it needs one.
    `allowed_tenants` are tenant ids (None: every tenant). `fallback_model`: a registered
    model that answers, once, an interactive request this model's engine refuses as
    overloaded (None: none).
    """

    name: str
    source: str
    format: str
    context_length: int
    revision: str = "main"
    input_price: int | None = None
    cached_input_price: int | None = None
    output_price: int | None = None
    batch_discount_pct: BatchDiscount | None = None
    allowed_tenants: list[str] | None = None
    fallback_model: str | None = None

    @field_validator("batch_discount_pct")
    @classmethod
    def _discount_needs_a_price(cls, value: int | None, info: ValidationInfo) -> int | None:
        # Without a price the model is unpriced: a discount alone would be dropped silently.
        # The prices are declared before it, so they are validated (in info.data) by now.
        prices = ("input_price", "cached_input_price", "output_price")
        if value is not None and all(info.data.get(p) is None for p in prices):
            raise ValueError("is part of a price: give input, cached input or output prices too")
        return value

    def prices(self) -> registry.Prices | None:
        """The first price, or None for an unpriced model."""
        fresh, cached, output = self.input_price, self.cached_input_price, self.output_price
        if fresh is None and cached is None and output is None:
            return None
        discount = self.batch_discount_pct
        return registry.Prices(
            fresh or 0,
            cached or 0,
            output or 0,
            DEFAULT_BATCH_DISCOUNT_PCT if discount is None else discount,
        )


class ModelUpdate(BaseModel):
    """A status, allow-list (tenant ids) or output cap change.

    `max_output_tokens`: absent keeps it, null clears it (the model's context length caps
    output), else 1 to 10**7 and at most the model's context length. `fallback_model`:
    absent keeps it, null clears it, else another registered model whose fallbacks do not
    lead back to this one.
    """

    status: str | None = None
    allowed_tenants: list[str] | None = None
    clear_allowed_tenants: bool = False
    max_output_tokens: StrictInt | None = None
    fallback_model: str | None = None


class PriceCreate(BaseModel):
    """A new price, effective from a time (default now).

    `batch_discount_pct`: the percent taken off batch lines' cost at this price (0 to
    100; default 50, whatever the price before it had, as every field of a new price).
    """

    input_price: int
    cached_input_price: int
    output_price: int
    batch_discount_pct: BatchDiscount = DEFAULT_BATCH_DISCOUNT_PCT
    effective_from: dt.datetime | None = None
    # One of the model's adapters: its own price (without one it is billed at the model's).
    adapter: str | None = None


class PricePublic(BaseModel):
    """One price of a model (micro-USD per million tokens) from `effective_from` on."""

    effective_from: IsoTime | None
    input_price: int
    cached_input_price: int
    output_price: int
    batch_discount_pct: int  # percent off batch lines' cost (the Batch API)
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
    # The model that answers its interactive requests when its engine is overloaded.
    fallback_model: str | None
    created_at: IsoTime | None
    price: PricePublic | None


class ModelDetail(ModelPublic):
    """A model with its whole price history (oldest first)."""

    price_history: list[PricePublic]
