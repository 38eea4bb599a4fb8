"""Model registry with price history, LoRA adapters and shared prefixes (flat data functions).

Like tenancy.store: keyword-only functions over a Session that commit their own
change and raise tenancy's NotFoundError / ConflictError / InvalidValueError.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from admin.models import (
    ADAPTER_STATUSES,
    DEFAULT_BATCH_DISCOUNT_PCT,
    MODEL_STATUSES,
    LoraAdapter,
    ModelPrice,
    RegisteredModel,
    SharedPrefix,
)
from tenancy.errors import ConflictError, InvalidValueError, NotFoundError
from tenancy.keys import new_id
from tenancy.models import Tenant

MODEL_FORMATS = ("gguf", "safetensors")
MAX_RANK = 4096
MAX_SOURCE_CHARS = 1024  # the source columns' width
MAX_ALLOWED_TENANTS = 1000  # bounds one allow-list (and the query checking it)
# A model's own output cap: far above any context we serve, far below the INTEGER column.
MAX_MODEL_OUTPUT_TOKENS = 10_000_000
KEEP: Any = object()  # "leave this setting as it is" (None clears it)

# The registry's named rows: each has a unique `name` column.
Named = TypeVar("Named", RegisteredModel, LoraAdapter, SharedPrefix)


@dataclass(frozen=True)
class Prices:
    """Micro-USD per million tokens; cost in pico-USD is tokens x price, exactly.

    `batch_discount_pct` (0 to 100) is taken off the cost of a batch line.
    """

    input: int
    cached_input: int
    output: int
    batch_discount_pct: int = DEFAULT_BATCH_DISCOUNT_PCT

    def cost_pico_usd(
        self,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        batch: bool = False,
    ) -> int:
        """Cost of one request; cached prompt tokens are billed at the cached price.

        A batch line costs (100 - batch_discount_pct)% of that, rounded down to the
        pico-USD (integer arithmetic, like the rest, so no float ever rounds a bill).
        """
        fresh = max(prompt_tokens - cached_tokens, 0)
        full = (
            fresh * self.input + cached_tokens * self.cached_input + completion_tokens * self.output
        )
        if not batch:
            return full
        return full * (100 - self.batch_discount_pct) // 100


FREE = Prices(0, 0, 0)


def _check_price(value: int, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidValueError(f"{what} must be a non-negative integer (micro-USD per M tokens)")


def check_batch_discount(value: Any) -> int:
    """`value` as a batch discount: an integer percent from 0 to 100, else InvalidValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise InvalidValueError("batch_discount_pct must be an integer from 0 to 100 (percent)")
    return value


def _named(session: Session, table: type[Named], name: str, what: str) -> Named:
    """The `table` row called `name`, or NotFoundError naming it a `what`."""
    row = session.scalars(select(table).where(table.name == name)).first()
    if row is None:
        raise NotFoundError(f"no {what} named {name!r}")
    return row


def _check_name_free(session: Session, table: type[Named], name: str, what: str) -> None:
    """ConflictError when a `table` row is already called `name` (`what`: "a model")."""
    if session.scalars(select(table.id).where(table.name == name)).first():
        raise ConflictError(f"{what} named {name!r} already exists")


def _by_name(
    session: Session, table: type[Named], *filters: ColumnElement[bool]
) -> Sequence[Named]:
    """The `table` rows passing every filter, by name."""
    return session.scalars(select(table).where(*filters).order_by(table.name)).all()


def _name_map(session: Session, value: InstrumentedAttribute[Any]) -> dict[str, Any]:
    """Model name -> its `value` column, for the models where it is set."""
    rows = session.execute(select(RegisteredModel.name, value).where(value.is_not(None))).all()
    return {name: v for name, v in rows if v is not None}


def get_model(session: Session, name: str) -> RegisteredModel:
    """The registered model called `name`, or NotFoundError."""
    return _named(session, RegisteredModel, name, "model")


def register_model(
    session: Session,
    *,
    name: str,
    source: str,
    format: str,
    context_length: int,
    revision: str = "main",
    prices: Prices | None = None,
    allowed_tenants: Sequence[str] | None = None,
    now: dt.datetime | None = None,
    fallback_model: str | None = None,
) -> RegisteredModel:
    """Register a model with its first price (effective now).

    `prices` None registers it without a price: its usage is billed $0 and marked
    unpriced until one is set (FREE is a deliberate price of $0, not unpriced).
    `allowed_tenants` are tenant ids (None: every tenant). `fallback_model`: a
    registered model its overloaded requests move to (see `check_fallback`).
    """
    if format not in MODEL_FORMATS:
        raise InvalidValueError(f"format must be one of {', '.join(MODEL_FORMATS)}")
    if not name or len(name) > 128 or context_length <= 0:
        raise InvalidValueError("name must be 1-128 characters and context_length positive")
    if not source or len(source) > MAX_SOURCE_CHARS:
        raise InvalidValueError(f"source must be 1-{MAX_SOURCE_CHARS} characters")
    _check_name_free(session, RegisteredModel, name, "a model")
    if allowed_tenants is not None:
        check_tenant_ids(session, allowed_tenants)
    if fallback_model is not None:
        check_fallback(session, name, fallback_model)
    row = RegisteredModel(
        id=new_id("mdl"),
        name=name,
        revision=revision,
        source=source,
        format=format,
        context_length=context_length,
        status="registered",
        allowed_tenants=sorted(set(allowed_tenants)) if allowed_tenants is not None else None,
        fallback_model=fallback_model,
    )
    session.add(row)
    session.flush()
    if prices is not None:
        _add_price(session, name, prices, now or dt.datetime.now(dt.UTC))
    session.commit()
    return row


def check_tenant_ids(session: Session, tenant_ids: Sequence[str]) -> None:
    """InvalidValueError unless every entry is the id of an existing tenant.

    A model's allow-list holds tenant ids (as keys hold model names), so renaming a
    tenant never changes what it may use; a name is refused with a hint.
    """
    if isinstance(tenant_ids, str) or not all(isinstance(t, str) for t in tenant_ids):
        raise InvalidValueError("allowed_tenants must be a list of tenant ids")
    if len(tenant_ids) > MAX_ALLOWED_TENANTS:
        raise InvalidValueError(f"allowed_tenants may list at most {MAX_ALLOWED_TENANTS} tenants")
    wanted = set(tenant_ids)
    known = set(session.scalars(select(Tenant.id).where(Tenant.id.in_(wanted))).all())
    unknown = sorted(wanted - known)
    if unknown:
        named = set(session.scalars(select(Tenant.name).where(Tenant.name.in_(unknown))).all())
        hint = " (these are tenant names; give their ids)" if named else ""
        raise InvalidValueError(f"allowed_tenants: no tenant with id {unknown[0]!r}{hint}")


def check_model_output_cap(value: Any, *, context_length: int | None) -> int | None:
    """A model's `max_output_tokens`: an integer from 1 to MAX_MODEL_OUTPUT_TOKENS and at
    most the model's context (None: the context alone caps it), else InvalidValueError."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_MODEL_OUTPUT_TOKENS
    ):
        raise InvalidValueError(
            f"max_output_tokens must be an integer from 1 to {MAX_MODEL_OUTPUT_TOKENS} "
            "(null: the model's context length)"
        )
    if context_length is not None and value > context_length:
        raise InvalidValueError(
            f"max_output_tokens {value} exceeds the model's context length {context_length}"
        )
    return value


def output_caps(session: Session) -> dict[str, int]:
    """Model name -> its own `max_output_tokens`, for the models that have one."""
    return _name_map(session, RegisteredModel.max_output_tokens)


def check_fallback(session: Session, model: str, fallback: Any) -> None:
    """InvalidValueError unless `fallback` may be `model`'s fallback: another registered
    model whose own fallbacks never lead back to `model` (A -> B -> A would let each
    overload bounce to the other)."""
    if not isinstance(fallback, str) or not fallback:
        raise InvalidValueError("fallback_model must be a registered model's name (null: none)")
    if fallback == model:
        raise InvalidValueError(f"fallback_model: model {model!r} cannot be its own fallback")
    known = select(RegisteredModel.id).where(RegisteredModel.name == fallback)
    if session.scalars(known).first() is None:
        raise InvalidValueError(f"fallback_model: no model named {fallback!r}")
    chain = fallbacks(session)
    seen = {model}
    step: str | None = fallback
    while step is not None:
        if step in seen:
            raise InvalidValueError(
                f"fallback_model: {fallback!r} falls back to {model!r} in turn (a cycle)"
            )
        seen.add(step)
        step = chain.get(step)


def fallbacks(session: Session) -> dict[str, str]:
    """Model name -> its fallback model's name, for the models that have one."""
    return _name_map(session, RegisteredModel.fallback_model)


def allow_lists(session: Session) -> dict[str, frozenset[str] | None]:
    """Model name -> the tenant ids that may use it (None: every tenant); every model."""
    rows = session.execute(select(RegisteredModel.name, RegisteredModel.allowed_tenants)).all()
    return {name: None if ids is None else frozenset(ids) for name, ids in rows}


def update_model(
    session: Session,
    *,
    name: str,
    status: str | None = None,
    allowed_tenants: Sequence[str] | None = None,
    clear_allowed_tenants: bool = False,
    max_output_tokens: Any = KEEP,
    fallback_model: Any = KEEP,
) -> RegisteredModel:
    """Change a model's status, tenant allow-list (tenant ids; None keeps it; clear:
    every tenant), output cap (`max_output_tokens`; KEEP keeps it, None: the model's
    context) or overload fallback (`fallback_model`; KEEP keeps it, None clears it).
    Every value is checked before anything changes."""
    row = get_model(session, name)
    if fallback_model is not KEEP and fallback_model is not None:
        check_fallback(session, name, fallback_model)
    if max_output_tokens is not KEEP:
        max_output_tokens = check_model_output_cap(
            max_output_tokens, context_length=row.context_length
        )
    if allowed_tenants is not None and not clear_allowed_tenants:
        check_tenant_ids(session, allowed_tenants)
    if status is not None:
        if status not in MODEL_STATUSES:
            raise InvalidValueError(f"status must be one of {', '.join(MODEL_STATUSES)}")
        row.status = status
    if clear_allowed_tenants:
        row.allowed_tenants = None
    elif allowed_tenants is not None:
        row.allowed_tenants = sorted(set(allowed_tenants))
    if max_output_tokens is not KEEP:
        row.max_output_tokens = max_output_tokens
    if fallback_model is not KEEP:
        row.fallback_model = fallback_model
    session.commit()
    return row


def list_models(session: Session, *, status: str | None = None) -> Sequence[RegisteredModel]:
    """Registered models by name, optionally filtered by status."""
    filters = [] if status is None else [RegisteredModel.status == status]
    return _by_name(session, RegisteredModel, *filters)


def _add_price(
    session: Session, model: str, prices: Prices, when: dt.datetime, adapter: str = ""
) -> ModelPrice:
    _check_price(prices.input, "input price")
    _check_price(prices.cached_input, "cached input price")
    _check_price(prices.output, "output price")
    check_batch_discount(prices.batch_discount_pct)
    row = ModelPrice(
        model_name=model,
        adapter=adapter,
        effective_from=when,
        input_micros_per_m=prices.input,
        cached_input_micros_per_m=prices.cached_input,
        output_micros_per_m=prices.output,
        batch_discount_pct=prices.batch_discount_pct,
    )
    session.add(row)
    return row


def set_price(
    session: Session,
    *,
    model: str,
    prices: Prices,
    effective_from: dt.datetime | None = None,
    adapter: str | None = None,
) -> ModelPrice:
    """Add a price from `effective_from` (default now); earlier usage keeps its old price.

    With `adapter` (one of `model`'s), the price is that adapter's own; an adapter
    without one in force is billed at `model`'s."""
    get_model(session, model)
    if adapter is not None and get_adapter(session, adapter).base_model != model:
        raise NotFoundError(f"model {model!r} has no adapter named {adapter!r}")
    when = effective_from or dt.datetime.now(dt.UTC)
    row = _add_price(session, model, prices, when, adapter or "")
    session.commit()
    return row


def price_history(
    session: Session, *, model: str, adapter: str | None = None
) -> Sequence[ModelPrice]:
    """Every price of `model` (or of its `adapter`, its own only), oldest first."""
    return session.scalars(
        select(ModelPrice)
        .where(ModelPrice.model_name == model, ModelPrice.adapter == (adapter or ""))
        .order_by(ModelPrice.effective_from)
    ).all()


def price_at(
    session: Session, *, model: str, when: dt.datetime, adapter: str | None = None
) -> Prices:
    """The price in force for `model` at `when`; FREE when it has none (see `price_in_force`)."""
    return price_in_force(session, model=model, when=when, adapter=adapter) or FREE


def price_in_force(
    session: Session, *, model: str, when: dt.datetime, adapter: str | None = None
) -> Prices | None:
    """The price in force for `model` (with `adapter`: that adapter's own, else the base
    model's) at `when`; None when it has none (unpriced), which is not a price of 0 (a
    deliberately free model)."""
    names = [adapter, ""] if adapter else [""]
    for name in names:
        row = session.scalars(
            select(ModelPrice)
            .where(
                ModelPrice.model_name == model,
                ModelPrice.adapter == name,
                ModelPrice.effective_from <= when,
            )
            .order_by(ModelPrice.effective_from.desc())
            .limit(1)
        ).first()
        if row is not None:
            return Prices(
                row.input_micros_per_m,
                row.cached_input_micros_per_m,
                row.output_micros_per_m,
                row.batch_discount_pct,
            )
    return None


def get_adapter(session: Session, name: str) -> LoraAdapter:
    """The adapter called `name`, or NotFoundError."""
    return _named(session, LoraAdapter, name, "adapter")


def check_adapter_name(name: str) -> None:
    """InvalidValueError unless `name` fits the registry: 1-128 characters, no NUL."""
    if not name or len(name) > 128 or "\x00" in name:
        raise InvalidValueError("adapter name must be 1-128 characters")


def register_adapter(
    session: Session,
    *,
    name: str,
    base_model: str,
    rank: int,
    source_path: str,
    owner_tenant_id: str | None = None,
) -> LoraAdapter:
    """Register a LoRA adapter of a registered base model (owner None: public)."""
    check_adapter_name(name)
    get_model(session, base_model)
    if isinstance(rank, bool) or not 0 < rank <= MAX_RANK:
        raise InvalidValueError(f"rank must be between 1 and {MAX_RANK}")
    if not source_path or len(source_path) > MAX_SOURCE_CHARS:
        raise InvalidValueError(f"source_path must be 1-{MAX_SOURCE_CHARS} characters")
    _check_name_free(session, LoraAdapter, name, "an adapter")
    row = LoraAdapter(
        id=new_id("lora"),
        name=name,
        base_model=base_model,
        owner_tenant_id=owner_tenant_id,
        rank=rank,
        source_path=source_path,
        status="registered",
    )
    session.add(row)
    session.commit()
    return row


def set_adapter_status(session: Session, *, name: str, status: str) -> LoraAdapter:
    """Move an adapter to registered | loaded | retired."""
    if status not in ADAPTER_STATUSES:
        raise InvalidValueError(f"status must be one of {', '.join(ADAPTER_STATUSES)}")
    row = get_adapter(session, name)
    row.status = status
    session.commit()
    return row


def adapter_allow_lists(session: Session) -> dict[str, frozenset[str] | None]:
    """ "base:adapter" -> the tenant that may use it (None: public, every tenant), for every
    adapter not retired. The gateway's model allow-lists carry these entries too; an
    adapter they do not list is unknown to it."""
    rows = session.execute(
        select(LoraAdapter.base_model, LoraAdapter.name, LoraAdapter.owner_tenant_id).where(
            LoraAdapter.status != "retired"
        )
    ).all()
    return {
        f"{base}:{name}": None if owner is None else frozenset((owner,))
        for base, name, owner in rows
    }


def list_adapters(
    session: Session, *, visible_to_tenant: str | None = None, base_model: str | None = None
) -> Sequence[LoraAdapter]:
    """Adapters by name; with `visible_to_tenant`, only that tenant's and public ones."""
    filters: list[ColumnElement[bool]] = []
    if visible_to_tenant is not None:
        filters.append(
            (LoraAdapter.owner_tenant_id.is_(None))
            | (LoraAdapter.owner_tenant_id == visible_to_tenant)
        )
    if base_model is not None:
        filters.append(LoraAdapter.base_model == base_model)
    return _by_name(session, LoraAdapter, *filters)


def publish_prefix(
    session: Session,
    *,
    name: str,
    model: str,
    token_ids: Sequence[int] | None = None,
    text: str | None = None,
) -> SharedPrefix:
    """Publish a shared prefix (token ids or text, exactly one) into the public domain."""
    if (token_ids is None) == (text is None):
        raise InvalidValueError("give exactly one of token_ids and text")
    if token_ids is not None and (
        not token_ids or not all(isinstance(t, int) and t >= 0 for t in token_ids)
    ):
        raise InvalidValueError("token_ids must be non-negative integers")
    if text is not None and not text:
        raise InvalidValueError("text must not be empty")
    get_model(session, model)
    _check_name_free(session, SharedPrefix, name, "a shared prefix")
    row = SharedPrefix(
        id=new_id("pfx"),
        name=name,
        model=model,
        token_ids=list(token_ids) if token_ids is not None else None,
        text=text,
    )
    session.add(row)
    session.commit()
    return row


def list_prefixes(session: Session, *, model: str | None = None) -> Sequence[SharedPrefix]:
    """Published prefixes by name."""
    filters = [] if model is None else [SharedPrefix.model == model]
    return _by_name(session, SharedPrefix, *filters)


def withdraw_prefix(session: Session, *, name: str) -> SharedPrefix:
    """Withdraw (delete) the published prefix called `name`; NotFoundError if none."""
    row = _named(session, SharedPrefix, name, "shared prefix")
    session.delete(row)
    session.commit()
    return row
