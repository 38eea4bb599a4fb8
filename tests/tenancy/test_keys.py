"""Key generation, peppered hashing, constant-time verification and lookup."""

from __future__ import annotations

import hashlib
import hmac

from sqlalchemy.orm import Session, sessionmaker

from tenancy import store
from tenancy.keys import KEY_PREFIX, find_key, generate_key, hash_secret, verify_secret
from tenancy.models import ApiKey
from tests.utils.principals import PEPPER


def test_generated_key_shape_and_hash() -> None:
    key = generate_key(PEPPER)
    assert key.secret.startswith(KEY_PREFIX)
    assert len(key.secret) - len(KEY_PREFIX) >= 40
    assert key.prefix == key.secret[:11] and key.prefix.startswith("sk-clo-")
    expected = hmac.new(PEPPER.encode(), key.secret.encode(), hashlib.sha256).hexdigest()
    assert key.secret_hash == expected
    assert key.secret not in repr(key)
    assert generate_key(PEPPER).secret != key.secret


def test_verify_depends_on_secret_and_pepper() -> None:
    key = generate_key(PEPPER)
    assert verify_secret(PEPPER, key.secret, key.secret_hash)
    assert not verify_secret("other-pepper", key.secret, key.secret_hash)
    assert not verify_secret(PEPPER, key.secret + "x", key.secret_hash)
    assert hash_secret(PEPPER, "a") != hash_secret(PEPPER, "b")


def test_find_key_by_hash_and_only_the_hash_is_stored(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory() as s:
        store.create_tenant(s, name="acme")
        created = store.create_key(s, tenant_name="acme", pepper=PEPPER)
        row = find_key(s, PEPPER, created.secret)
        assert row is not None and row.id == created.id
        last = "B" if created.secret.endswith("A") else "A"  # a different final character
        assert find_key(s, PEPPER, created.secret[:-1] + last) is None
        assert find_key(s, "wrong", created.secret) is None
        assert find_key(s, PEPPER, "not-a-key") is None
        stored = s.get(ApiKey, created.id)
        assert stored is not None
        columns = [getattr(stored, c.key) for c in ApiKey.__table__.columns]
        assert all(created.secret not in str(v) for v in columns)
