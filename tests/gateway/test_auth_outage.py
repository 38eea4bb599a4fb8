"""The gateway's key cache while the database cannot answer, and its revocation window.

Issue 13 §7: a database stall turned every request into a 500. Now cached keys
are served within `refresh_s + max_stale_s`, nothing waits on a known-dead
database, and what cannot be served is AuthUnavailableError (503). Issue 14 §3:
one cache, so a revoked key is refused within `refresh_s`.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from gateway.auth_cache import CachingAuthenticator
from tenancy import store
from tenancy.auth_throttle import FailureThrottle
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.errors import AuthenticationError, AuthThrottledError, AuthUnavailableError
from tests.gateway.test_auth_and_admission import Clock, CountingAuthenticator

PEPPER = "outage-pepper"


class FlakyAuthenticator(CountingAuthenticator):
    """A CountingAuthenticator whose database can be made to fail or hang."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.hang = threading.Event()  # set: reads block until released
        self.release = threading.Event()

    def authenticate(self, bearer: str | None):  # type: ignore[no-untyped-def]
        """Raises OperationalError while down; blocks while hanging."""
        if self.hang.is_set():
            self.release.wait(10)
        if self.down:
            self.calls += 1
            raise OperationalError("SELECT", {}, Exception("database is locked"))
        return super().authenticate(bearer)


def test_outage_serves_cached_keys_within_the_bound_and_503s_the_rest() -> None:
    inner, clock = FlakyAuthenticator(), Clock()
    auth = CachingAuthenticator(inner, refresh_s=2.0, max_stale_s=10.0, retry_s=1.0, clock=clock)

    async def scenario() -> None:
        good = await auth.authenticate("good")
        with pytest.raises(AuthenticationError):
            await auth.authenticate("bad")
        inner.down = True
        clock.now += 5.0  # both entries are past refresh_s: a read is due and fails
        assert await auth.authenticate("good") == good
        with pytest.raises(AuthenticationError):  # a cached refusal stays a refusal
            await auth.authenticate("bad")
        with pytest.raises(AuthUnavailableError) as unknown:
            await auth.authenticate("never-seen")
        assert unknown.value.retry_after_s == 1.0
        calls = inner.calls
        assert await auth.authenticate("good") == good  # known outage: no wait, no read
        await auth.drain()
        assert inner.calls == calls
        clock.now += 8.0  # 13 s old: past refresh_s + max_stale_s
        with pytest.raises(AuthUnavailableError):
            await auth.authenticate("good")
        inner.down = False
        clock.now += 1.5  # the retry interval passed: the next call reads again
        assert await auth.authenticate("good") == good

    asyncio.run(scenario())


def test_a_hanging_database_times_out_to_the_cache() -> None:
    inner, clock = FlakyAuthenticator(), Clock()
    auth = CachingAuthenticator(
        inner, refresh_s=2.0, max_stale_s=60.0, read_timeout_s=0.2, clock=clock
    )

    async def scenario() -> None:
        good = await auth.authenticate("good")
        inner.hang.set()
        clock.now += 3.0
        assert await auth.authenticate("good") == good  # after read_timeout_s, from the cache
        with pytest.raises(AuthUnavailableError):
            await auth.authenticate("other")  # at once: the database is known to hang
        inner.hang.clear()
        inner.release.set()
        await auth.drain()

    asyncio.run(scenario())


def test_bad_credentials_are_throttled_per_source_but_known_keys_pass() -> None:
    inner = CountingAuthenticator()
    throttle = FailureThrottle(limit=3, window_s=60.0)
    auth = CachingAuthenticator(inner, refresh_s=60.0, throttle=throttle)

    async def scenario() -> None:
        await auth.authenticate("good", source="10.0.0.1")
        for i in range(3):
            with pytest.raises(AuthenticationError):
                await auth.authenticate(f"bad-{i}", source="10.0.0.1")
        reads = inner.calls
        with pytest.raises(AuthThrottledError) as refused:
            await auth.authenticate("bad-new", source="10.0.0.1")
        assert refused.value.retry_after_s > 0 and inner.calls == reads  # no database read
        assert await auth.authenticate("good", source="10.0.0.1")  # a cached valid key passes
        with pytest.raises(AuthenticationError):  # another source is not affected
            await auth.authenticate("bad-0", source="10.0.0.2")

    asyncio.run(scenario())


def test_a_revoked_key_is_refused_within_refresh_s(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cloister.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        store.create_tenant(s, name="acme")
        created = store.create_key(s, tenant_name="acme", pepper=PEPPER)
    refresh_s = 2.0

    def revoked_after(inner_refresh_s: float) -> float:
        """How long after a revocation the key was still accepted (clock steps of 0.1 s)."""
        clock = Clock()
        inner = Authenticator(sessions, PEPPER, refresh_s=inner_refresh_s, clock=clock)
        auth = CachingAuthenticator(inner, refresh_s=refresh_s, clock=clock)

        async def scenario() -> float:
            await auth.authenticate(created.secret)
            with sessions() as s:
                store.revoke_key(s, key_id=created.id)
            revoked_at = clock.now
            accepted_until = revoked_at
            # Calls at the worst phase for two caches in series: just before refresh_s,
            # then once the refreshed entry is half-way stale, then later.
            for offset in (0.95 * refresh_s, 1.45 * refresh_s, 2.2 * refresh_s, 3 * refresh_s):
                clock.now = revoked_at + offset
                try:
                    await auth.authenticate(created.secret)
                    accepted_until = clock.now
                except AuthenticationError:
                    pass
                await auth.drain()
            return accepted_until - revoked_at

        window = asyncio.run(scenario())
        with sessions() as s:  # un-revoke for the next run
            from tenancy.models import ApiKey

            row = s.get(ApiKey, created.id)
            assert row is not None
            row.revoked_at = None
            s.commit()
        return window

    # The way cloister serve wires it: one cache (the inner one keeps none).
    assert revoked_after(0.0) < refresh_s
    # Two caches in series (the old wiring) let it through for up to 1.5 x refresh_s.
    assert revoked_after(refresh_s) > refresh_s
