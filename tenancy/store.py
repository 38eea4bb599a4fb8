"""Data functions for tenants, keys and limits (used by the CLI and the admin API).

Flat keyword-only functions over a Session; they raise tenancy errors
(NotFoundError, ConflictError, InvalidValueError) and commit their own change.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tenancy.authenticator import load_effective_limits
from tenancy.errors import ConflictError, InvalidValueError, NotFoundError
from tenancy.keys import generate_key, new_id
from tenancy.limits import EffectiveLimits
from tenancy.models import ApiKey, Limit, Tenant
from tenancy.validation import (
    check_expires_in_days,
    check_flag,
    check_floor_blocks,
    check_floor_share,
    check_key_metadata,
    check_key_name,
    check_kv_quota_blocks,
    check_limit_int,
    check_optional_flag,
    check_retention_ttl,
    check_stream_cadence,
    check_tenant_name,
    check_weight,
)

ISOLATION_LEVELS = ("tenant", "key", "user")
BUDGET_PERIODS = ("day", "month")
LIMIT_FIELDS = (
    "rpm",
    "tpm",
    "max_concurrent",
    "token_budget",
    "budget_period",
    "max_output_tokens",
    "max_prompt_tokens",
    "allowed_models",
    "max_tokens_in_flight",
)
MAX_OUTPUT_TOKENS = 10_000_000  # the most a tenant's or key's output cap may be
UNSET: Any = object()  # "leave this field as it is" (None means "clear it")
# Tenant fields `update_tenant` sets, each with its check (None: the engine default).
TENANT_POLICY_FIELDS: dict[str, Callable[[Any], Any]] = {
    "weight": check_weight,
    "cache_floor_blocks": check_floor_blocks,
    "cache_floor_share": check_floor_share,
    "retention_ttl_s": check_retention_ttl,
    "scrub_on_free": lambda v: check_optional_flag("scrub_on_free", v),
    "never_cache": lambda v: check_flag("never_cache", v),
    "kv_quota_blocks": check_kv_quota_blocks,
    "stream_cadence": check_stream_cadence,
}


@dataclass(frozen=True)
class CreatedKey:
    """A new key; `secret` exists only here, never in the database."""

    id: str
    tenant_id: str
    prefix: str
    secret: str = field(repr=False)


def get_tenant(session: Session, name: str) -> Tenant:
    """The tenant called `name`, or NotFoundError."""
    tenant = session.scalars(select(Tenant).where(Tenant.name == name)).first()
    if tenant is None:
        raise NotFoundError(f"no tenant named {name!r}")
    return tenant


def create_tenant(
    session: Session,
    *,
    name: str,
    isolation_level: str = "tenant",
    weight: float = 1.0,
    stream_cadence: str = "token",
) -> Tenant:
    """Create an active tenant; ConflictError when the name is taken."""
    name = check_tenant_name(name.strip() if isinstance(name, str) else name)
    if isolation_level not in ISOLATION_LEVELS:
        raise InvalidValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}")
    weight = check_weight(weight)
    stream_cadence = check_stream_cadence(stream_cadence)
    if session.scalars(select(Tenant.id).where(Tenant.name == name)).first() is not None:
        raise ConflictError(f"a tenant named {name!r} already exists")
    tenant = Tenant(
        id=new_id("ten"),
        name=name,
        status="active",
        isolation_level=isolation_level,
        weight=weight,
        stream_cadence=stream_cadence,
    )
    session.add(tenant)
    try:
        session.commit()
    except IntegrityError as exc:  # a concurrent create won the race
        session.rollback()
        raise ConflictError(f"a tenant named {name!r} already exists") from exc
    return tenant


def list_tenants(session: Session, *, include_deleted: bool = True) -> Sequence[Tenant]:
    """Every tenant, by name (without the deleted ones unless `include_deleted`)."""
    query = select(Tenant).order_by(Tenant.name)
    if not include_deleted:
        query = query.where(Tenant.deleted_at.is_(None))
    return session.scalars(query).all()


def _refuse_deleted(tenant: Tenant) -> Tenant:
    if tenant.deleted_at is not None:
        raise ConflictError(f"tenant {tenant.name!r} was deleted")
    return tenant


def set_tenant_status(session: Session, *, name: str, status: str) -> Tenant:
    """Suspend ("suspended") or resume ("active") a tenant; a deleted one stays deleted."""
    if status not in ("active", "suspended"):
        raise InvalidValueError("status must be active or suspended")
    tenant = _refuse_deleted(get_tenant(session, name))
    tenant.status = status
    session.commit()
    return tenant


@dataclass(frozen=True)
class DeletedTenant:
    """What a delete did: the tenant, and the ids of the keys it revoked."""

    tenant: Tenant
    revoked_key_ids: tuple[str, ...]


def delete_tenant(session: Session, *, name: str) -> DeletedTenant:
    """Soft-delete a tenant: suspended, every live key revoked, `deleted_at` set.

    The row stays so that its usage, billing lines and audit records keep their owner,
    and its name stays taken (a new tenant of the same name would inherit that history
    in exports). Deleting a deleted tenant is a ConflictError.
    """
    tenant = _refuse_deleted(get_tenant(session, name))
    now = dt.datetime.now(dt.UTC)
    keys = session.scalars(
        select(ApiKey).where(ApiKey.tenant_id == tenant.id, ApiKey.revoked_at.is_(None))
    ).all()
    for key in keys:
        key.revoked_at = now
    tenant.status = "suspended"
    tenant.deleted_at = now
    session.commit()
    return DeletedTenant(tenant=tenant, revoked_key_ids=tuple(sorted(k.id for k in keys)))


def update_tenant(session: Session, *, name: str, **values: Any) -> Tenant:
    """Set a tenant's weight and cache policy (TENANT_POLICY_FIELDS); fields not passed
    (or UNSET) keep their value, None clears an optional one back to the engine default.

    Every value is checked before anything changes. The floor is one setting, in blocks
    or as a share of the pool: setting one clears the other; giving both is refused.
    """
    unknown = set(values) - set(TENANT_POLICY_FIELDS)
    if unknown:
        raise InvalidValueError(f"unknown tenant fields: {', '.join(sorted(unknown))}")
    checked = {
        key: TENANT_POLICY_FIELDS[key](value) for key, value in values.items() if value is not UNSET
    }
    blocks, share = checked.get("cache_floor_blocks"), checked.get("cache_floor_share")
    if blocks is not None and share is not None:
        raise InvalidValueError(
            "give the cache floor as blocks or as a share of the pool, not both"
        )
    if blocks is not None:
        checked["cache_floor_share"] = None
    if share is not None:
        checked["cache_floor_blocks"] = None
    tenant = get_tenant(session, name)
    for column, value in checked.items():
        setattr(tenant, column, value)
    session.commit()
    return tenant


def _check_limit_value(name: str, value: Any) -> None:
    if value is None or value is UNSET:
        return
    if name == "budget_period":
        if value not in BUDGET_PERIODS:
            raise InvalidValueError("budget period must be day or month")
    elif name == "allowed_models":
        if not isinstance(value, list | tuple | frozenset | set) or not all(
            isinstance(m, str) and m for m in value
        ):
            raise InvalidValueError("allowed models must be a list of names")
    else:
        check_limit_int(name, value)
        if name == "max_tokens_in_flight" and value < 1:
            # 0 would refuse every request as too big alone; suspend a tenant instead.
            raise InvalidValueError("max_tokens_in_flight must be at least 1")
        if name == "max_output_tokens" and not 1 <= value <= MAX_OUTPUT_TOKENS:
            # 0 lets nothing be generated, and no model's context holds 10**7 tokens.
            raise InvalidValueError(
                f"max_output_tokens must be an integer from 1 to {MAX_OUTPUT_TOKENS}"
            )


def set_limits(
    session: Session, *, tenant_name: str, key_id: str | None = None, **values: Any
) -> EffectiveLimits:
    """Set limit fields of a tenant (or a per-key override); returns the limits in force.

    Fields not passed (or UNSET) keep their value; None clears one (unlimited / inherit).
    """
    unknown = set(values) - set(LIMIT_FIELDS)
    if unknown:
        raise InvalidValueError(f"unknown limit fields: {', '.join(sorted(unknown))}")
    for name, value in values.items():
        _check_limit_value(name, value)
    tenant = get_tenant(session, tenant_name)
    if key_id is not None:
        key = session.get(ApiKey, key_id)
        if key is None or key.tenant_id != tenant.id:
            raise NotFoundError(f"tenant {tenant_name!r} has no key {key_id!r}")
    row = session.scalars(
        select(Limit).where(
            Limit.tenant_id == tenant.id,
            Limit.key_id.is_(None) if key_id is None else Limit.key_id == key_id,
        )
    ).first()
    if row is None:
        row = Limit(tenant_id=tenant.id, key_id=key_id)
        session.add(row)
    for name, value in values.items():
        if value is UNSET:
            continue
        if name == "allowed_models" and value is not None:
            value = sorted(set(value))
        setattr(row, name, value)
    if row.token_budget is not None and row.budget_period is None and key_id is None:
        row.budget_period = "month"
    session.commit()
    return load_effective_limits(session, tenant.id, key_id)


def get_limits(session: Session, *, tenant_name: str, key_id: str | None = None) -> EffectiveLimits:
    """The limits in force for a tenant (or one of its keys)."""
    tenant = get_tenant(session, tenant_name)
    return load_effective_limits(session, tenant.id, key_id)


def create_key(
    session: Session,
    *,
    tenant_name: str,
    pepper: str,
    name: str | None = None,
    allowed_models: Sequence[str] | None = None,
    expires_in_days: float | None = None,
    metadata: dict[str, str] | None = None,
) -> CreatedKey:
    """Create a key for a tenant; the secret is returned once and stored only as a hash."""
    _check_limit_value("allowed_models", list(allowed_models) if allowed_models else None)
    name = check_key_name(name)
    expires_in_days = check_expires_in_days(expires_in_days)
    metadata = check_key_metadata(metadata)
    tenant = _refuse_deleted(get_tenant(session, tenant_name))
    generated = generate_key(pepper)
    now = dt.datetime.now(dt.UTC)
    key = ApiKey(
        id=new_id("key"),
        tenant_id=tenant.id,
        prefix=generated.prefix,
        secret_hash=generated.secret_hash,
        name=name,
        allowed_models=sorted(set(allowed_models)) if allowed_models else None,
        key_metadata=metadata,
        created_at=now,
        expires_at=now + dt.timedelta(days=expires_in_days) if expires_in_days else None,
    )
    session.add(key)
    session.commit()
    return CreatedKey(id=key.id, tenant_id=tenant.id, prefix=key.prefix, secret=generated.secret)


def list_keys(session: Session, *, tenant_name: str) -> Sequence[ApiKey]:
    """A tenant's keys, oldest first (hashes included; never print them)."""
    tenant = get_tenant(session, tenant_name)
    return session.scalars(
        select(ApiKey).where(ApiKey.tenant_id == tenant.id).order_by(ApiKey.created_at, ApiKey.id)
    ).all()


def key_status(key: ApiKey, now: dt.datetime | None = None) -> str:
    """ "revoked", "expired" or "active": what the authenticator would make of the key now."""
    if key.revoked_at is not None:
        return "revoked"
    now = now or dt.datetime.now(dt.UTC)
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    return "active"


class Revocable(Protocol):
    """A credential row revoked by setting its `revoked_at` (a key or an admin token)."""

    revoked_at: dt.datetime | None


RevocableRow = TypeVar("RevocableRow", bound=Revocable)


def revoke_once(session: Session, row: RevocableRow | None, missing: str) -> RevocableRow:
    """Revokes `row` and commits, unless it already was: the first revocation time is
    kept, so revoking twice is harmless. NotFoundError(`missing`) when `row` is None."""
    if row is None:
        raise NotFoundError(missing)
    if row.revoked_at is None:
        row.revoked_at = dt.datetime.now(dt.UTC)
        session.commit()
    return row


def revoke_key(session: Session, *, key_id: str) -> ApiKey:
    """Revoke a key (idempotent: the first revocation time is kept)."""
    return revoke_once(session, session.get(ApiKey, key_id), f"no key {key_id!r}")
