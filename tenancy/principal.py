"""The authenticated caller and its cache domain."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from tenancy.limits import EffectiveLimits
from tenancy.scopes import key_scope, tenant_scope

IsolationLevel = Literal["tenant", "key", "user"]

# Server-generated ids never contain the separators ":" or "/", so the domain
# string "t:<tenant>/k:<key>" parses one way only; checked, never assumed.
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant and key behind a verified bearer token, with its limits."""

    tenant_id: str
    tenant_name: str
    key_id: str
    isolation_level: IsolationLevel
    weight: float
    limits: EffectiveLimits
    allowed_models: frozenset[str] | None  # None: every model in the registry
    never_cache: bool = False  # the tenant's policy: no request of it reads or writes the cache
    # Streamed text in chunks of this many tokens (None: as the engine emits it), so that
    # chunk sizes and timing do not show how many tokens each engine step produced.
    stream_chunk_tokens: int | None = None


def _checked_id(value: str, what: str) -> str:
    if not _ID_RE.match(value):
        raise ValueError(f"malformed {what} id {value!r}")
    return value


def derive_cache_domain(principal: Principal, user: str | None = None) -> str:
    """The prefix-cache domain for a request; always rooted at the authenticated tenant.

    tenant -> "t:<tenant_id>"; key -> "t:<tenant_id>/k:<key_id>";
    user -> "t:<tenant_id>/u:<sha256(user)[:16]>" (no user: the tenant domain).
    The client-sent `user` is hashed, so it can never inject separators.
    """
    tenant_id = _checked_id(principal.tenant_id, "tenant")
    tenant = tenant_scope(tenant_id)
    if principal.isolation_level == "key":
        return key_scope(tenant_id, _checked_id(principal.key_id, "key"))
    if principal.isolation_level == "user" and user:
        digest = hashlib.sha256(user.encode("utf-8")).hexdigest()[:16]
        return f"{tenant}/u:{digest}"
    return tenant
