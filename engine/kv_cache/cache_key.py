"""The cache key: the root of every prefix chain, derived from who may share a prefix.

Fields are length-prefixed and hashed with SHA-256, so that no two different tuples
(domain, adapter, revision) give one key: ("org_1", "2345") and ("org_12345", "")
encode to different bytes before any hashing happens. Python's `hash()` is never
used (it is salted per process and only 64 bits wide).
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

_VERSION = b"cloister-cache-key/v1"
# Tags keep a None adapter apart from an empty name, and the public domain apart
# from any string a tenant's domain could ever be.
_TAG_NONE = b"\x00"
_TAG_STR = b"\x01"
_TAG_PUBLIC = b"\x02"


def _field(value: str | None) -> bytes:
    if value is None:
        return _TAG_NONE
    raw = value.encode("utf-8")
    return _TAG_STR + struct.pack(">Q", len(raw)) + raw


def encode_key_fields(domain: str | None, adapter: str | None, revision: str) -> bytes:
    """The unambiguous byte encoding hashed into a key; `domain=None` is the public domain."""
    head = _TAG_PUBLIC if domain is None else _field(domain)
    return _VERSION + head + _field(adapter) + _field(revision)


@dataclass(frozen=True)
class CacheKey:
    """Who may share a cached prefix: one cache domain, one adapter, one model revision."""

    domain: str | None  # None: the public domain of published prefixes
    adapter: str | None
    revision: str
    digest: bytes

    @classmethod
    def derive(cls, domain: str, adapter: str | None, revision: str) -> CacheKey:
        """The key of a tenant's (or key's, or user's) cache domain."""
        if not domain:
            raise ValueError("a cache domain is a non-empty string")
        return cls(domain, adapter, revision, _sha256(encode_key_fields(domain, adapter, revision)))

    @classmethod
    def public(cls, adapter: str | None, revision: str) -> CacheKey:
        """The key of published prefixes, which any domain may read."""
        return cls(None, adapter, revision, _sha256(encode_key_fields(None, adapter, revision)))

    def continuation(self, published_digest: bytes) -> bytes:
        """The chain root of this key's blocks that follow a published prefix."""
        return _sha256(b"continuation" + self.digest + struct.pack(">Q", 32) + published_digest)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Hash of one full block, chained on its parent's hash (or the chain root)."""
    tokens = array("q", token_ids).tobytes()
    return hashlib.blake2b(
        parent + struct.pack(">Q", len(tokens)) + tokens, digest_size=32
    ).digest()


def tokens_digest(token_ids: Sequence[int]) -> bytes:
    """A digest of a token sequence (identifies a published prefix)."""
    return hashlib.sha256(b"tokens" + array("q", token_ids).tobytes()).digest()
