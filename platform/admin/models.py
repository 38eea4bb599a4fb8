"""Tables owned by the admin service, on tenancy's declarative Base (one metadata for Alembic).

Money is integer: prices are micro-USD per million tokens, costs are pico-USD
(tokens x micro-USD-per-million = pico-USD exactly), so sums never round.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from admin.roles import ROLES
from tenancy.models import Base, UTCDateTime, utcnow

MODEL_STATUSES = ("registered", "loaded", "retired")
ADAPTER_STATUSES = ("registered", "loaded", "retired")
# The percent taken off a batch line's cost (the Batch API) unless its price says
# otherwise: batch work only fills what interactive work leaves, so it costs less.
DEFAULT_BATCH_DISCOUNT_PCT = 50


def _one_of(column: str, values: tuple[str, ...], name: str) -> CheckConstraint:
    """A check that `column` holds one of `values`, the same tuple the code validates
    against, so the database and the code cannot disagree."""
    quoted = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({quoted})", name=name)


class RegisteredModel(Base):
    """A model in the registry; `allowed_tenants` None means every tenant may use it."""

    __tablename__ = "registry_models"
    __table_args__ = (_one_of("status", MODEL_STATUSES, "ck_registry_models_status"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    revision: Mapped[str] = mapped_column(String(128), default="main")
    source: Mapped[str] = mapped_column(String(1024))
    format: Mapped[str] = mapped_column(String(16))
    context_length: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="registered")
    allowed_tenants: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # What the server that loaded it runs it on; None unless loaded (migration 0005).
    device: Mapped[str | None] = mapped_column(String(32), default=None)
    dtype: Mapped[str | None] = mapped_column(String(16), default=None)
    # The most output tokens one request may ask of it (None: its context); migration 0012.
    max_output_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    # Its family ("qwen3") and how its matrices are stored ("Q4_K+Q6_K", "BF16"), as the
    # server that loaded it read them; None if unknown (migration 0013).
    family: Mapped[str | None] = mapped_column(String(32), default=None)
    quantization: Mapped[str | None] = mapped_column(String(64), default=None)
    # The model an interactive request moves to, once, when this one's engine queue
    # refuses it (None: none); a registered model's name, never a cycle (migration 0015).
    fallback_model: Mapped[str | None] = mapped_column(String(128), default=None)


class ModelPrice(Base):
    """One price of a model from `effective_from` on (the history is never rewritten)."""

    __tablename__ = "model_prices"
    __table_args__ = (
        UniqueConstraint("model_name", "adapter", "effective_from", name="uq_model_prices"),
        CheckConstraint(
            "batch_discount_pct BETWEEN 0 AND 100", name="ck_model_prices_batch_discount_pct"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_name: Mapped[str] = mapped_column(String(128), index=True)
    # "" the base model's own price; else one adapter's (migration 0009), which falls back
    # to the base model's while it has none in force.
    adapter: Mapped[str] = mapped_column(String(128), default="", server_default="")
    effective_from: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    input_micros_per_m: Mapped[int] = mapped_column(BigInteger)
    cached_input_micros_per_m: Mapped[int] = mapped_column(BigInteger)
    output_micros_per_m: Mapped[int] = mapped_column(BigInteger)
    # Percent taken off a batch line's cost at this price (migration 0014); part of the
    # price, so a change of discount is a new price row like any other.
    batch_discount_pct: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_BATCH_DISCOUNT_PCT, server_default=str(DEFAULT_BATCH_DISCOUNT_PCT)
    )


class LoraAdapter(Base):
    """A PEFT LoRA adapter; `owner_tenant_id` None means public."""

    __tablename__ = "lora_adapters"
    __table_args__ = (_one_of("status", ADAPTER_STATUSES, "ck_lora_adapters_status"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    base_model: Mapped[str] = mapped_column(String(128))
    owner_tenant_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("tenants.id", ondelete="CASCADE"), default=None, index=True
    )
    rank: Mapped[int] = mapped_column(Integer)
    source_path: Mapped[str] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16), default="registered")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class SharedPrefix(Base):
    """A prefix an admin published into the public cache domain (token ids or text)."""

    __tablename__ = "shared_prefixes"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    model: Mapped[str] = mapped_column(String(128))
    token_ids: Mapped[list[int] | None] = mapped_column(JSON, default=None)
    text: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AdminToken(Base):
    """An admin API token, stored as an HMAC like tenant keys."""

    __tablename__ = "admin_tokens"
    __table_args__ = (_one_of("role", ROLES, "ck_admin_tokens_role"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128), default=None)
    role: Mapped[str] = mapped_column(String(16))
    tenant_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("tenants.id", ondelete="CASCADE"), default=None
    )
    prefix: Mapped[str] = mapped_column(String(32))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)


class UsageRow(Base):
    """One request's usage; the primary key makes a second write of the same id a no-op."""

    __tablename__ = "usage_records"
    __table_args__ = (
        Index("ix_usage_records_tenant_time", "tenant_id", "occurred_at"),
        Index("ix_usage_records_tenant_client_request", "tenant_id", "client_request_id"),
    )

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    occurred_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), index=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    key_id: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    adapter: Mapped[str] = mapped_column(String(128), default="")
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    cost_pico_usd: Mapped[int] = mapped_column(BigInteger)
    ttft_s: Mapped[float | None] = mapped_column(Float, default=None)
    latency_s: Mapped[float] = mapped_column(Float)
    status: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(32), default=None)
    client_disconnected: Mapped[bool] = mapped_column(Boolean, default=False)
    # Tokens used while the model had no price in force: billed $0, but marked so.
    unpriced: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The client's x-request-id (migration 0006): not unique, since retries and other
    # tenants reuse ids; looked up per tenant.
    client_request_id: Mapped[str | None] = mapped_column(String(128), default=None)
    # A line of a tenant's batch (the Batch API), billed at its price's batch discount
    # (migration 0014).
    batch: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class UsageHourly(Base):
    """Hourly sums of usage_records, updated in the same transaction as each insert."""

    __tablename__ = "usage_hourly"

    hour: Mapped[dt.datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    adapter: Mapped[str] = mapped_column(String(128), primary_key=True)
    # The HTTP status: refused requests (429, 503, ...) are counted apart, with zero tokens.
    status: Mapped[int] = mapped_column(Integer, primary_key=True, default=200)
    # Batch lines (UsageRow.batch) are summed apart from interactive ones, since they are
    # billed at another price (migration 0014).
    batch: Mapped[bool] = mapped_column(
        Boolean, primary_key=True, default=False, server_default=false()
    )
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_pico_usd: Mapped[int] = mapped_column(BigInteger, default=0)
    # How many of `requests` were unpriced (UsageRow.unpriced); migration 0005.
    unpriced_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class AuditEvent(Base):
    """One audit record; `hash` = sha256(prev_hash + canonical JSON of the fields)."""

    __tablename__ = "audit_events"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    at: Mapped[str] = mapped_column(String(40))  # ISO-8601 UTC, hashed as text
    actor: Mapped[str] = mapped_column(String(256))
    # The actor's display name (token name, OIDC name); hashed only when set (0006).
    actor_name: Mapped[str | None] = mapped_column(String(256), default=None)
    role: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[str | None] = mapped_column(String(32), default=None)
    action: Mapped[str] = mapped_column(String(128))
    resource: Mapped[str] = mapped_column(String(512))
    outcome: Mapped[str] = mapped_column(String(32))
    source_ip: Mapped[str | None] = mapped_column(String(64), default=None)
    request_id: Mapped[str | None] = mapped_column(String(128), default=None)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class AuditCheckpoint(Base):
    """An Ed25519 signature over (seq, hash of that record, previous checkpoint's digest)."""

    __tablename__ = "audit_checkpoints"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    record_hash: Mapped[str] = mapped_column(String(64))
    prev_digest: Mapped[str] = mapped_column(String(64))
    public_key: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[str] = mapped_column(String(40))
