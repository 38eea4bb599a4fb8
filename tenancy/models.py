"""Database tables of the tenancy layer (SQLAlchemy 2.0 typed declarative).

Schema changes go through a new Alembic revision in migrations/versions/.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    TypeDecorator,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; use datetime.now(UTC)")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        stamp: dt.datetime = value
        if stamp.tzinfo is None:
            return stamp.replace(tzinfo=dt.UTC)
        return stamp.astimezone(dt.UTC)


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


def _unique_where(name: str, column: str, where: str) -> Index:
    """A unique index on `column` over the rows matching `where`: a partial index, with
    the same predicate on each backend."""
    return Index(name, column, unique=True, sqlite_where=text(where), postgresql_where=text(where))


class Base(DeclarativeBase):
    """Declarative base for every Cloister table (Alembic's target metadata)."""


class Tenant(Base):
    """A customer organisation; every key and limit belongs to one."""

    __tablename__ = "tenants"
    __table_args__ = (
        CheckConstraint("status IN ('active', 'suspended')", name="ck_tenants_status"),
        CheckConstraint(
            "isolation_level IN ('tenant', 'key', 'user')", name="ck_tenants_isolation"
        ),
        CheckConstraint("weight > 0", name="ck_tenants_weight"),
        CheckConstraint(
            "cache_floor_blocks IS NULL OR cache_floor_blocks >= 0",
            name="ck_tenants_cache_floor_blocks",
        ),
        CheckConstraint(
            "cache_floor_share IS NULL OR (cache_floor_share >= 0 AND cache_floor_share <= 1)",
            name="ck_tenants_cache_floor_share",
        ),
        CheckConstraint(
            "retention_ttl_s IS NULL OR retention_ttl_s > 0", name="ck_tenants_retention_ttl"
        ),
        CheckConstraint(
            "kv_quota_blocks IS NULL OR kv_quota_blocks >= 1", name="ck_tenants_kv_quota_blocks"
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="active")
    isolation_level: Mapped[str] = mapped_column(String(16), default="tenant")
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    # Cache policy, pushed to the running engine (None: the engine's default).
    cache_floor_blocks: Mapped[int | None] = mapped_column(Integer, default=None)
    cache_floor_share: Mapped[float | None] = mapped_column(Float, default=None)
    retention_ttl_s: Mapped[float | None] = mapped_column(Float, default=None)
    scrub_on_free: Mapped[bool | None] = mapped_column(Boolean, default=None)
    never_cache: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # Hard cap on the KV blocks the tenant's running sequences may hold (None: no cap).
    kv_quota_blocks: Mapped[int | None] = mapped_column(Integer, default=None)
    # How the gateway chunks this tenant's streamed text: "token" or "fixed:N" (see
    # gateway/stream_cadence.py); checked by the store, not by the database.
    stream_cadence: Mapped[str] = mapped_column(
        String(16), default="token", server_default=text("'token'")
    )
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Set by a delete: the tenant stays (suspended, its keys revoked) so that its usage,
    # billing and audit records keep their owner; its name stays taken.
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)


class ApiKey(Base):
    """An API key, stored only as an HMAC of its secret plus a display prefix."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    prefix: Mapped[str] = mapped_column(String(32))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str | None] = mapped_column(String(128), default=None)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    # Labels of the operator's own (owner, environment, ...), bounded by the store's
    # checks; `metadata` is taken on a declarative class, hence the attribute name.
    key_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)


class Limit(Base):
    """Limits of a tenant (key_id NULL) or a per-key override. NULL: unlimited / inherit."""

    __tablename__ = "limits"
    __table_args__ = (
        # One tenant-wide row per tenant and one override row per key.
        _unique_where("uq_limits_tenant", "tenant_id", "key_id IS NULL"),
        _unique_where("uq_limits_key", "key_id", "key_id IS NOT NULL"),
        CheckConstraint(
            "budget_period IS NULL OR budget_period IN ('day', 'month')",
            name="ck_limits_budget_period",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(32), ForeignKey("tenants.id", ondelete="CASCADE"))
    key_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("api_keys.id", ondelete="CASCADE"), default=None
    )
    rpm: Mapped[int | None] = mapped_column(Integer, default=None)
    tpm: Mapped[int | None] = mapped_column(Integer, default=None)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, default=None)
    token_budget: Mapped[int | None] = mapped_column(Integer, default=None)
    budget_period: Mapped[str | None] = mapped_column(String(8), default=None)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    max_prompt_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    # Prompt + max output tokens of the requests in flight (migration 0012).
    max_tokens_in_flight: Mapped[int | None] = mapped_column(Integer, default=None)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class SecretPin(Base):
    """A fingerprint of one deployment secret (never the secret), pinned by the first
    process that used the database with it, so that a gateway or CLI holding another
    value is refused at start instead of failing keys, sessions or audit checkpoints."""

    __tablename__ = "secret_pins"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(128))
    pinned_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
