"""CacheKey: length-prefixed, fixed-hash, collision-free across field boundaries."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from engine.kv_cache.cache_key import CacheKey, block_hash, encode_key_fields

COLLISION_VECTORS = [
    ("org_1", "2345", "r"),
    ("org_12345", "", "r"),
    ("org_12345", None, "r"),
    ("org_1", "2345r", ""),
    ("org_12345r", None, ""),
    ("t:a", "t:b", "r"),  # an adapter named like a domain
    ("t:b", "t:a", "r"),
    ("t:a", None, "t:b"),
    ("t:a", "", "t:b"),
    ("t:at:b", None, "r"),
]


def test_collision_vectors_give_distinct_keys() -> None:
    keys = [CacheKey.derive(d, a, r).digest for d, a, r in COLLISION_VECTORS]
    assert len(set(keys)) == len(keys)
    # Also distinct from the public key of every (adapter, revision) involved.
    public = {CacheKey.public(a, r).digest for _, a, r in COLLISION_VECTORS}
    assert not public & set(keys)


def test_key_is_a_fixed_sha256_not_python_hash() -> None:
    key = CacheKey.derive("org_1", "2345", "r")
    assert len(key.digest) == 32
    assert key == CacheKey.derive("org_1", "2345", "r")
    # Pinned bytes: the encoding must not change silently (it would orphan every cache).
    assert encode_key_fields("a", None, "") == (
        b"cloister-cache-key/v1"
        + b"\x01\x00\x00\x00\x00\x00\x00\x00\x01a"
        + b"\x00"
        + b"\x01\x00\x00\x00\x00\x00\x00\x00\x00"
    )


@given(
    st.tuples(st.text(min_size=1), st.none() | st.text(), st.text()),
    st.tuples(st.text(min_size=1), st.none() | st.text(), st.text()),
)
def test_distinct_tuples_never_share_an_encoding(
    a: tuple[str, str | None, str], b: tuple[str, str | None, str]
) -> None:
    if a != b:
        assert encode_key_fields(*a) != encode_key_fields(*b)


def test_block_hash_depends_on_parent_and_tokens() -> None:
    roots = [CacheKey.derive(d, a, r).digest for d, a, r in COLLISION_VECTORS[:3]]
    hashes = {block_hash(r, t) for r, t in itertools.product(roots, [(1, 2), (2, 1), (1, 2, 0)])}
    assert len(hashes) == 9
