"""Authentication outcomes and how fast a running Authenticator sees changes."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tenancy import store
from tenancy.authenticator import Authenticator
from tenancy.errors import AuthenticationError
from tenancy.key_usage import LastUsedWriter
from tenancy.models import ApiKey
from tests.utils.principals import PEPPER


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _reason(auth: Authenticator, bearer: str | None) -> str:
    with pytest.raises(AuthenticationError) as err:
        auth.authenticate(bearer)
    return err.value.reason


@pytest.fixture
def acme(session_factory: sessionmaker[Session]) -> str:
    with session_factory() as s:
        store.create_tenant(s, name="acme", isolation_level="key", weight=2.0)
        store.set_limits(s, tenant_name="acme", rpm=10, tpm=500, allowed_models=["m1", "m2"])
        return store.create_key(s, tenant_name="acme", pepper=PEPPER, allowed_models=["m2"]).secret


def test_valid_key_gives_principal(session_factory: sessionmaker[Session], acme: str) -> None:
    last_used = LastUsedWriter(session_factory)
    auth = Authenticator(session_factory, PEPPER, refresh_s=5, last_used=last_used)
    p = auth.authenticate(f"Bearer {acme}")
    assert p.tenant_name == "acme" and p.isolation_level == "key" and p.weight == 2.0
    assert (p.limits.rpm, p.limits.tpm) == (10, 500)
    assert p.allowed_models == frozenset({"m2"})  # key narrows the tenant's list
    assert auth.authenticate(acme) == p
    with session_factory() as s:
        assert s.get(ApiKey, p.key_id).last_used_at is None  # type: ignore[union-attr]
    assert last_used.flush()  # written in the background, not by authenticate
    with session_factory() as s:
        assert s.get(ApiKey, p.key_id).last_used_at is not None  # type: ignore[union-attr]


def test_missing_and_invalid(session_factory: sessionmaker[Session], acme: str) -> None:
    auth = Authenticator(session_factory, PEPPER, refresh_s=5)
    assert _reason(auth, None) == "missing"
    assert _reason(auth, "Bearer ") == "missing"
    assert _reason(auth, "sk-clo-" + "x" * 43) == "invalid"
    assert _reason(auth, "garbage") == "invalid"
    assert _reason(Authenticator(session_factory, "other", refresh_s=5), acme) == "invalid"


def test_revoked_suspended_expired_within_refresh(
    session_factory: sessionmaker[Session], acme: str
) -> None:
    clock = FakeClock()
    auth = Authenticator(session_factory, PEPPER, refresh_s=2.0, clock=clock)
    key_id = auth.authenticate(acme).key_id
    with session_factory() as s:
        store.set_tenant_status(s, name="acme", status="suspended")
    clock.t += 1.0
    auth.authenticate(acme)  # still cached: changes may lag by up to refresh_s
    clock.t += 1.0
    assert _reason(auth, acme) == "suspended"
    with session_factory() as s:
        store.set_tenant_status(s, name="acme", status="active")
        store.revoke_key(s, key_id=key_id)
    clock.t += 2.0
    assert _reason(auth, acme) == "revoked"
    with session_factory() as s:
        expired = store.create_key(s, tenant_name="acme", pepper=PEPPER, expires_in_days=1)
        row = s.get(ApiKey, expired.id)
        assert row is not None
        row.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        s.commit()
    assert _reason(auth, expired.secret) == "expired"


def test_limit_changes_picked_up(session_factory: sessionmaker[Session], acme: str) -> None:
    clock = FakeClock()
    auth = Authenticator(session_factory, PEPPER, refresh_s=2.0, clock=clock)
    assert auth.authenticate(acme).limits.rpm == 10
    with session_factory() as s:
        store.set_limits(s, tenant_name="acme", rpm=3)
    clock.t += 2.0
    assert auth.authenticate(acme).limits.rpm == 3


def test_principal_of_key_reads_the_key_now_and_refuses_it_once_unusable(
    session_factory: sessionmaker[Session], acme: str
) -> None:
    """The batch runner's lookup by key id: the same principal as the bearer's, and the
    same refusals once the key is revoked or its tenant suspended (no cache to outlive)."""
    auth = Authenticator(session_factory, PEPPER, refresh_s=60.0)
    principal = auth.authenticate(acme)
    assert auth.principal_of_key(principal.key_id) == principal
    with pytest.raises(AuthenticationError) as missing:
        auth.principal_of_key("key_nope")
    assert missing.value.reason == "invalid"
    with session_factory() as s:
        store.set_tenant_status(s, name="acme", status="suspended")
    with pytest.raises(AuthenticationError) as suspended:
        auth.principal_of_key(principal.key_id)
    assert suspended.value.reason == "suspended"
    with session_factory() as s:
        store.set_tenant_status(s, name="acme", status="active")
        store.revoke_key(s, key_id=principal.key_id)
    with pytest.raises(AuthenticationError) as revoked:
        auth.principal_of_key(principal.key_id)
    assert revoked.value.reason == "revoked"
