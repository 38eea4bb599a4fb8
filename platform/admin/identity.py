"""Who is calling the admin API: admin API tokens (hashed at rest) and signed session tokens.

Session tokens are what an OIDC sign-in yields: "ses.<payload>.<mac>", an
HMAC-SHA256 over a JSON payload with an expiry, keyed by the session key: a secret of
its own (never the key pepper), so that knowing the pepper forges nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from admin.errors import Unauthenticated
from admin.models import AdminToken
from admin.roles import ROLES, Role
from tenancy.errors import InvalidValueError, NotFoundError
from tenancy.keys import hash_secret, new_id
from tenancy.models import Tenant
from tenancy.store import revoke_once
from tenancy.validation import check_key_name

TOKEN_PREFIX = "clo-adm-"
SESSION_PREFIX = "ses."


@dataclass(frozen=True)
class AdminIdentity:
    """An authenticated admin caller; `tenant_id` is set exactly for tenant-admin.

    `actor` is the stable id ("token:<id>", "oidc:<email or sub>"); `name` what a person
    reads in the audit log (the token's name, the OIDC name or email), if any.
    """

    actor: str
    role: Role
    tenant_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class CreatedToken:
    """A new admin token; `secret` exists only here."""

    id: str
    role: Role
    tenant_id: str | None
    secret: str = field(repr=False)


def check_role(role: str, tenant_id: str | None) -> Role:
    """Validates a role and its tenant binding."""
    if role not in ROLES:
        raise InvalidValueError(f"role must be one of {', '.join(ROLES)}")
    if (role == "tenant-admin") != (tenant_id is not None):
        raise InvalidValueError("a tenant is required for tenant-admin and only for it")
    return role


def create_admin_token(
    session: Session,
    *,
    pepper: str,
    role: str,
    tenant_name: str | None = None,
    name: str | None = None,
) -> CreatedToken:
    """Creates an admin API token (tenant-admin needs `tenant_name`)."""
    name = check_key_name(name, what="token name")
    tenant_id = None
    if tenant_name is not None:
        tenant = session.scalars(select(Tenant).where(Tenant.name == tenant_name)).first()
        if tenant is None:
            raise NotFoundError(f"no tenant named {tenant_name!r}")
        tenant_id = tenant.id
    checked = check_role(role, tenant_id)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = AdminToken(
        id=new_id("adm"),
        name=name,
        role=checked,
        tenant_id=tenant_id,
        prefix=secret[: len(TOKEN_PREFIX) + 4],
        secret_hash=hash_secret(pepper, secret),
    )
    session.add(row)
    session.commit()
    return CreatedToken(id=row.id, role=checked, tenant_id=tenant_id, secret=secret)


def revoke_admin_token(session: Session, *, token_id: str) -> AdminToken:
    """Revokes an admin token (idempotent)."""
    return revoke_once(session, session.get(AdminToken, token_id), f"no admin token {token_id!r}")


def _session_key(key: str) -> bytes:
    return hashlib.sha256(b"cloister-admin-session:" + key.encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue_session(
    session_key: str, identity: AdminIdentity, ttl_s: int, now: float | None = None
) -> str:
    """A session token for `identity`, valid `ttl_s` seconds, signed with `session_key`."""
    payload = {
        "sub": identity.actor,
        "role": identity.role,
        "tenant": identity.tenant_id,
        "name": identity.name,
        "exp": int((now or time.time()) + ttl_s),
    }
    body = _b64(json.dumps(payload, sort_keys=True).encode())
    mac = _b64(hmac.new(_session_key(session_key), body.encode(), hashlib.sha256).digest())
    return f"{SESSION_PREFIX}{body}.{mac}"


def _from_session(session_key: str, token: str) -> AdminIdentity:
    if not token.isascii():  # header bytes beyond ASCII; compare_digest refuses such str
        raise Unauthenticated("malformed session token")
    try:
        body, mac = token[len(SESSION_PREFIX) :].split(".")
        key = _session_key(session_key)
        expected = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(mac, expected):
            raise Unauthenticated("bad session signature")
        payload = json.loads(_unb64(body))
    except (ValueError, json.JSONDecodeError) as exc:
        raise Unauthenticated("malformed session token") from exc
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        raise Unauthenticated("malformed session token")  # a session never lasts forever
    if exp <= time.time():
        raise Unauthenticated("session expired")
    tenant = payload.get("tenant")
    try:
        role = check_role(payload.get("role", ""), tenant)
    except (InvalidValueError, TypeError) as exc:
        raise Unauthenticated("malformed session token") from exc
    sub = payload.get("sub")
    if not isinstance(sub, str) or not sub or (tenant is not None and not isinstance(tenant, str)):
        raise Unauthenticated("malformed session token")
    name = payload.get("name")
    return AdminIdentity(
        actor=sub, role=role, tenant_id=tenant, name=name if isinstance(name, str) else None
    )


def authenticate_admin(
    session: Session, pepper: str, bearer: str | None, *, session_key: str
) -> AdminIdentity:
    """The identity behind an Authorization header value (token or session); Unauthenticated.

    Admin tokens are looked up by their hash under `pepper`; session tokens are checked
    against `session_key`.
    """
    token = (bearer or "").strip()
    scheme, _, rest = token.partition(" ")
    if scheme.lower() == "bearer":
        token = rest.strip()
    if not token:
        raise Unauthenticated("no admin credential")
    if token.startswith(SESSION_PREFIX):
        return _from_session(session_key, token)
    if not token.startswith(TOKEN_PREFIX):
        raise Unauthenticated("invalid admin token")
    digest = hash_secret(pepper, token)
    row = session.scalars(select(AdminToken).where(AdminToken.secret_hash == digest)).first()
    if row is None or not hmac.compare_digest(row.secret_hash, digest):
        raise Unauthenticated("invalid admin token")
    if row.revoked_at is not None:
        raise Unauthenticated("admin token revoked")
    return AdminIdentity(
        actor=f"token:{row.id}",
        role=check_role(row.role, row.tenant_id),
        tenant_id=row.tenant_id,
        name=row.name,
    )
