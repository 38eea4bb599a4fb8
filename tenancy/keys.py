"""API key generation, peppered hashing and lookup. Secrets are never logged or stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from tenancy.models import ApiKey

KEY_PREFIX = "sk-clo-"
SECRET_BYTES = 32  # token_urlsafe(32) -> 43 characters
DISPLAY_CHARS = 4  # random characters kept after KEY_PREFIX for display


@dataclass(frozen=True)
class GeneratedKey:
    """A fresh key: `secret` is shown to the user once; only `secret_hash` is stored."""

    secret: str = field(repr=False)
    prefix: str
    secret_hash: str


def new_id(kind: str) -> str:
    """A short random public id such as "key_3f9a0c1b2d4e" (no ":" or "/", see principal)."""
    return f"{kind}_{secrets.token_hex(6)}"


def hash_secret(pepper: str, secret: str) -> str:
    """HMAC-SHA256(pepper, secret) as hex: a stolen table is useless without the pepper."""
    return hmac.new(pepper.encode("utf-8"), secret.encode("utf-8"), hashlib.sha256).hexdigest()


def verify_secret(pepper: str, secret: str, secret_hash: str) -> bool:
    """Whether `secret` hashes to `secret_hash`, compared in constant time."""
    return hmac.compare_digest(hash_secret(pepper, secret), secret_hash)


def display_prefix(secret: str) -> str:
    """The part of a key safe to show again, e.g. "sk-clo-AbCd"."""
    return secret[: len(KEY_PREFIX) + DISPLAY_CHARS]


def generate_key(pepper: str) -> GeneratedKey:
    """A new random key "sk-clo-<43 url-safe chars>" and its hash."""
    secret = KEY_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
    return GeneratedKey(
        secret=secret, prefix=display_prefix(secret), secret_hash=hash_secret(pepper, secret)
    )


def looks_like_key(secret: str) -> bool:
    """A cheap shape check before touching the database."""
    return secret.startswith(KEY_PREFIX) and 20 <= len(secret) <= 200


def find_key(session: Session, pepper: str, secret: str) -> ApiKey | None:
    """The key row whose hash matches `secret`, or None.

    The lookup is by hash (an index), then re-verified with compare_digest so the
    final decision never depends on a short-circuiting string comparison.
    """
    if not looks_like_key(secret):
        return None
    digest = hash_secret(pepper, secret)
    row = session.scalars(select(ApiKey).where(ApiKey.secret_hash == digest)).first()
    if row is None or not hmac.compare_digest(row.secret_hash, digest):
        return None
    return row
