"""Bearer key -> Principal, read from the database (optionally cached for `refresh_s`).

A running gateway puts its own cache in front of this (gateway/auth_cache.py)
and builds this with `refresh_s=0`, so there is one cache and one revocation
window. Reads only: a use of a key is noted to a `LastUsedWriter`, which writes
`last_used_at` in the background, so a locked or stalled database never turns
an authentication into a write that waits.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tenancy.errors import AuthenticationError, PermissionDeniedError
from tenancy.key_usage import LastUsedWriter
from tenancy.keys import find_key, hash_secret
from tenancy.limits import EffectiveLimits, LimitValues, merge_limits
from tenancy.models import ApiKey, Limit, Tenant
from tenancy.principal import IsolationLevel, Principal
from tenancy.validation import stream_cadence_tokens

MAX_CACHED_KEYS = 10_000  # bounds memory under a flood of random bearer tokens


@dataclass(frozen=True)
class _KeyState:
    """What the database said about one key at one moment."""

    principal: Principal
    tenant_active: bool
    expires_at: dt.datetime | None
    revoked: bool


def limit_values(row: Limit | None) -> LimitValues | None:
    """A limits row as plain values."""
    if row is None:
        return None
    return LimitValues(
        rpm=row.rpm,
        tpm=row.tpm,
        max_concurrent=row.max_concurrent,
        token_budget=row.token_budget,
        budget_period=row.budget_period,  # type: ignore[arg-type]
        max_output_tokens=row.max_output_tokens,
        max_prompt_tokens=row.max_prompt_tokens,
        allowed_models=frozenset(row.allowed_models) if row.allowed_models is not None else None,
        max_tokens_in_flight=row.max_tokens_in_flight,
    )


def load_effective_limits(session: Session, tenant_id: str, key_id: str | None) -> EffectiveLimits:
    """The limits in force for a key (or for the tenant when key_id is None)."""
    rows = session.scalars(select(Limit).where(Limit.tenant_id == tenant_id)).all()
    tenant_row = next((r for r in rows if r.key_id is None), None)
    key_row = next((r for r in rows if key_id is not None and r.key_id == key_id), None)
    return merge_limits(limit_values(tenant_row), limit_values(key_row))


def _intersect(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


class Authenticator:
    """Verifies bearer keys; thread-safe; see the module docstring."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        pepper: str,
        refresh_s: float = 2.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        last_used: LastUsedWriter | None = None,
    ) -> None:
        self._sessions = session_factory
        self._last_used = last_used
        self._pepper = pepper
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        # secret hash -> (loaded at, state or None for "no such key")
        self._cache: OrderedDict[str, tuple[float, _KeyState | None]] = OrderedDict()

    def authenticate(self, bearer: str | None) -> Principal:
        """The principal behind `bearer` (the token, or "Bearer <token>").

        Raises AuthenticationError with reason missing|invalid|expired|revoked|suspended.
        """
        token = (bearer or "").strip()
        scheme, _, rest = token.partition(" ")
        if scheme.lower() == "bearer":
            token = rest.strip()
        if not token:
            raise AuthenticationError("missing", "no API key provided")
        state = self._state(token)
        if state is None:
            raise AuthenticationError("invalid", "invalid API key")
        return self._checked(state)

    def _state(self, token: str) -> _KeyState | None:
        digest = hash_secret(self._pepper, token)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None and now - hit[0] < self._refresh_s:
                self._cache.move_to_end(digest)
                return hit[1]
        state = self._load(token)
        if self._refresh_s <= 0:
            return state  # no cache of its own: the caller caches
        with self._lock:
            self._cache[digest] = (now, state)
            self._cache.move_to_end(digest)
            while len(self._cache) > MAX_CACHED_KEYS:
                self._cache.popitem(last=False)
        return state

    def principal_of_key(self, key_id: str) -> Principal:
        """The principal of the key `key_id`, read now (no cache), for work the key queued
        earlier (a batch): the same refusals as `authenticate` if it was revoked, expired,
        or its tenant suspended since."""
        with self._sessions() as session:
            key = session.get(ApiKey, key_id)
            state = None if key is None else self._key_state(session, key)
        if state is None:
            raise AuthenticationError("invalid", "the API key no longer exists")
        return self._checked(state)

    def _checked(self, state: _KeyState) -> Principal:
        if state.revoked:
            raise AuthenticationError("revoked", "API key has been revoked")
        if state.expires_at is not None and state.expires_at <= dt.datetime.now(dt.UTC):
            raise AuthenticationError("expired", "API key has expired")
        if not state.tenant_active:
            raise AuthenticationError("suspended", "tenant is suspended")
        return state.principal

    def _load(self, token: str) -> _KeyState | None:
        with self._sessions() as session:
            key = find_key(session, self._pepper, token)
            if key is None:
                return None
            state = self._key_state(session, key)
        if state is not None and self._last_used is not None:
            # Noted once per read (per refresh), written in the background.
            self._last_used.touch(state.principal.key_id)
        return state

    def _key_state(self, session: Session, key: ApiKey) -> _KeyState | None:
        tenant = session.get(Tenant, key.tenant_id)
        if tenant is None:
            return None
        limits = load_effective_limits(session, tenant.id, key.id)
        key_models = frozenset(key.allowed_models) if key.allowed_models is not None else None
        principal = Principal(
            tenant_id=tenant.id,
            tenant_name=tenant.name,
            key_id=key.id,
            isolation_level=_isolation(tenant.isolation_level),
            weight=tenant.weight,
            limits=limits,
            allowed_models=_intersect(key_models, limits.allowed_models),
            never_cache=bool(tenant.never_cache),
            stream_chunk_tokens=stream_cadence_tokens(tenant.stream_cadence),
        )
        return _KeyState(
            principal=principal,
            tenant_active=tenant.status == "active",
            expires_at=key.expires_at,
            revoked=key.revoked_at is not None,
        )


def _isolation(value: str) -> IsolationLevel:
    if value == "key":
        return "key"
    if value == "user":
        return "user"
    return "tenant"


def allowed_models(principal: Principal, registry_names: Iterable[str]) -> list[str]:
    """The registry's model (and adapter) names this principal may use, in registry order."""
    if principal.allowed_models is None:
        return list(registry_names)
    return [name for name in registry_names if name in principal.allowed_models]


def check_model(principal: Principal, model: str) -> None:
    """Raise PermissionDeniedError unless the principal may use `model`."""
    if principal.allowed_models is not None and model not in principal.allowed_models:
        raise PermissionDeniedError(model)
