"""Authentication on the event loop: the gateway's one key cache, database reads off the loop.

The tenancy `Authenticator` reads the database, so it must not run on the
event loop; and a thread hop per request costs more than the whole in-memory
check. This cache sits in front of it (built with no cache of its own):

    age <  refresh_s / 2   answer inline from memory (the hot path)
    age <  refresh_s       answer inline, and refresh in the background
    otherwise / unknown    await one threaded read (single-flight per key)

so steady traffic on a key never waits for the database, and a change made with
the CLI or the admin API (revocation, suspension, new limits) is refused within
`refresh_s` (the revocation window) plus one database read. Failures (invalid,
revoked, ...) are cached like successes, so a flood of bad tokens costs one read
per token per `refresh_s`, and a source that sends too many bad credentials is
refused with 429 before any read (`FailureThrottle`).

When the database cannot answer (an error, or no answer within `read_timeout_s`)
a cached answer up to `refresh_s + max_stale_s` old is served instead, and for
`retry_s` after a failure no request waits on the database at all (the
first call after that reads again); anything
that cannot be served so raises `AuthUnavailableError` (503 with Retry-After).
Entries are keyed by a digest of the bearer value, never the secret itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from tenancy.auth_throttle import FailureThrottle
from tenancy.errors import AuthenticationError, AuthFailure, AuthUnavailableError
from tenancy.principal import Principal

logger = logging.getLogger("cloister.gateway")

MAX_ENTRIES = 10_000  # bounds memory under a flood of random bearer tokens
READ_THREADS = 4  # database reads in flight at once; the rest queue (never the loop)


class AuthenticatorLike(Protocol):
    """Bearer credential -> Principal; raises tenancy's AuthenticationError. May block."""

    def authenticate(self, bearer: str | None) -> Principal:
        """The principal behind the Authorization header value (or the bare token)."""
        ...


class DenialRecorder(Protocol):
    """Where refused credentials and requests are reported (aggregated; never blocks)."""

    def denied(
        self,
        *,
        source: str | None,
        actor: str,
        role: str,
        outcome: str,
        action: str,
        resource: str,
        reason: str,
        tenant_id: str | None = None,
    ) -> None:
        """Counts one denial."""
        ...


@dataclass(frozen=True)
class _Entry:
    """One answer of the inner authenticator and when it was obtained."""

    loaded_at: float
    principal: Principal | None
    failure: tuple[AuthFailure, str] | None  # (reason, message) of an AuthenticationError


def _digest(bearer: str | None) -> bytes:
    # A fast keyed-free digest is enough: it only indexes this process's memory.
    return hashlib.blake2b((bearer or "").encode(), digest_size=16).digest()


def _retrieved(future: asyncio.Future[_Entry]) -> None:
    if not future.cancelled():
        future.exception()  # seen: callers that timed out do not leave it unretrieved


class CachingAuthenticator:
    """An async front for an `AuthenticatorLike`; see the module docstring."""

    def __init__(
        self,
        inner: AuthenticatorLike,
        *,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_ENTRIES,
        max_stale_s: float = 0.0,
        read_timeout_s: float = 5.0,
        retry_s: float = 1.0,
        throttle: FailureThrottle | None = None,
        denials: DenialRecorder | None = None,
    ) -> None:
        self._inner = inner
        self._refresh_s = refresh_s
        self._clock = clock
        self._max_entries = max_entries
        self._max_stale_s = max_stale_s
        self._read_timeout_s = read_timeout_s
        self._retry_s = retry_s
        self._throttle = throttle
        self._denials = denials
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._loading: dict[bytes, asyncio.Future[_Entry]] = {}
        self._background: set[asyncio.Task[_Entry]] = set()
        self._unavailable_until = 0.0  # the database failed: do not wait on it before this
        # Its own threads: a stalled database must not occupy the loop's default executor.
        self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="cloister-auth")

    async def authenticate(self, bearer: str | None, *, source: str | None = None) -> Principal:
        """The principal behind `bearer`; raises AuthenticationError, AuthThrottledError
        (429) or AuthUnavailableError (503). `source` is the client address."""
        key = _digest(bearer)
        entry = self._entries.get(key)
        now = self._clock()
        if entry is not None:
            age = now - entry.loaded_at
            if age < self._refresh_s:
                if age >= self._refresh_s / 2 and key not in self._loading:
                    self._refresh_in_background(key, bearer)
                self._entries.move_to_end(key)
                return self._answer(entry, source)
        if self._throttle is not None and (entry is None or entry.failure is not None):
            self._throttle.check(source)
        if now < self._unavailable_until:
            # Known outage: answer from what we have at once; a read is tried again
            # by the first call after retry_s.
            return self._answer(self._stale(entry, now), source)
        load = asyncio.ensure_future(self._load(key, bearer))
        load.add_done_callback(_retrieved)  # it may outlive this caller's timeout
        try:
            fresh = await asyncio.wait_for(asyncio.shield(load), self._read_timeout_s)
        except Exception as exc:  # database error or timeout: not the caller's fault
            self._mark_unavailable(exc)
            return self._answer(self._stale(entry, now), source)
        return self._answer(fresh, source)

    def forget(self) -> None:
        """Drops every cached answer (the next call per key reads through)."""
        self._entries.clear()

    async def drain(self) -> None:
        """Waits for background refreshes (at shutdown)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def denied(
        self,
        *,
        source: str | None,
        principal: Principal,
        reason: str,
        resource: str,
        outcome: str = "denied:403",
    ) -> None:
        """Reports an authorization denial of an authenticated key (e.g. model not allowed;
        an adapter it may not use is `outcome` "denied:404", the status it was answered)."""
        if self._denials is not None:
            self._denials.denied(
                source=source,
                actor=f"key:{principal.key_id}",
                role="tenant",
                outcome=outcome,
                action="gateway.authorize",
                resource=resource,
                reason=reason,
                tenant_id=principal.tenant_id,
            )

    def _stale(self, entry: _Entry | None, now: float) -> _Entry:
        if entry is not None and now - entry.loaded_at < self._refresh_s + self._max_stale_s:
            return entry
        raise AuthUnavailableError(retry_after_s=self._retry_s)

    def _mark_unavailable(self, exc: BaseException) -> None:
        if self._clock() >= self._unavailable_until:
            logger.warning(
                "key store unavailable (%s); serving cached keys up to %.0fs stale",
                type(exc).__name__,
                self._refresh_s + self._max_stale_s,
            )
        self._unavailable_until = self._clock() + self._retry_s

    def _answer(self, entry: _Entry, source: str | None) -> Principal:
        if entry.failure is not None:
            reason = entry.failure[0]
            if self._throttle is not None and reason != "missing":
                self._throttle.failed(source)
            if self._denials is not None:
                self._denials.denied(
                    source=source,
                    actor="anonymous",
                    role="none",
                    outcome="denied:401",
                    action="gateway.authenticate",
                    resource="gateway",
                    reason=reason,
                )
            # A fresh exception each time: re-raising one instance would grow its traceback.
            raise AuthenticationError(*entry.failure)
        assert entry.principal is not None
        return entry.principal

    def _refresh_in_background(self, key: bytes, bearer: str | None) -> None:
        task = asyncio.ensure_future(self._load(key, bearer))
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[_Entry]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._mark_unavailable(task.exception() or RuntimeError())

    async def _load(self, key: bytes, bearer: str | None) -> _Entry:
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            loop = asyncio.get_running_loop()
            entry = await loop.run_in_executor(self._pool, self._read_through, bearer)
            self._store(key, entry)
            self._unavailable_until = 0.0  # the database answered
            future.set_result(entry)
        except BaseException as exc:
            # Database outages and the like: nothing is cached, the callers see the error.
            future.set_exception(exc)
            future.exception()  # marks it retrieved when nobody else waits on it
            raise
        finally:
            del self._loading[key]
        return entry

    def _read_through(self, bearer: str | None) -> _Entry:
        # loaded_at is taken before the read, so an entry never claims to be newer than it is.
        started = self._clock()
        try:
            principal = self._inner.authenticate(bearer)
        except AuthenticationError as exc:
            return _Entry(loaded_at=started, principal=None, failure=(exc.reason, str(exc)))
        return _Entry(loaded_at=started, principal=principal, failure=None)

    def _store(self, key: bytes, entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
