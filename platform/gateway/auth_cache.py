"""Authentication on the event loop: answers from memory, database reads off the loop.

The tenancy `Authenticator` may read (and write `last_used_at` to) the database,
so it must not run on the event loop; but a thread hop per request costs more
than the whole in-memory check. This cache sits in front of it:

    age <  refresh_s / 2   answer inline from memory (the hot path)
    age <  refresh_s       answer inline, and refresh in the background
    otherwise / unknown    await one threaded `authenticate` (single-flight per key)

so steady traffic on a key never waits for the database, and a change made with
the CLI or the admin API (revocation, suspension, new limits) is seen within
`refresh_s` plus one database read. Failures (invalid, revoked, ...) are cached
like successes, so a flood of bad tokens costs one read per token per `refresh_s`.
Entries are keyed by a digest of the bearer value, never the secret itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tenancy.errors import AuthenticationError, AuthFailure
from tenancy.principal import Principal

MAX_ENTRIES = 10_000  # bounds memory under a flood of random bearer tokens


class AuthenticatorLike(Protocol):
    """Bearer credential -> Principal; raises tenancy's AuthenticationError. May block."""

    def authenticate(self, bearer: str | None) -> Principal:
        """The principal behind the Authorization header value (or the bare token)."""
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


class CachingAuthenticator:
    """An async front for an `AuthenticatorLike`; see the module docstring."""

    def __init__(
        self,
        inner: AuthenticatorLike,
        *,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._inner = inner
        self._refresh_s = refresh_s
        self._clock = clock
        self._max_entries = max_entries
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._loading: dict[bytes, asyncio.Future[_Entry]] = {}
        self._background: set[asyncio.Task[_Entry]] = set()

    async def authenticate(self, bearer: str | None) -> Principal:
        """The principal behind `bearer`; raises tenancy's AuthenticationError."""
        key = _digest(bearer)
        entry = self._entries.get(key)
        if entry is not None:
            age = self._clock() - entry.loaded_at
            if age < self._refresh_s:
                if age >= self._refresh_s / 2 and key not in self._loading:
                    self._refresh_in_background(key, bearer)
                self._entries.move_to_end(key)
                return self._answer(entry)
        return self._answer(await self._load(key, bearer))

    def forget(self) -> None:
        """Drops every cached answer (the next call per key reads through)."""
        self._entries.clear()

    async def drain(self) -> None:
        """Waits for background refreshes (at shutdown)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    @staticmethod
    def _answer(entry: _Entry) -> Principal:
        if entry.failure is not None:
            # A fresh exception each time: re-raising one instance would grow its traceback.
            raise AuthenticationError(*entry.failure)
        assert entry.principal is not None
        return entry.principal

    def _refresh_in_background(self, key: bytes, bearer: str | None) -> None:
        task = asyncio.ensure_future(self._load(key, bearer))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _load(self, key: bytes, bearer: str | None) -> _Entry:
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            entry = await asyncio.to_thread(self._read_through, bearer)
            self._store(key, entry)
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
        # The inner authenticator keeps its own short cache; loaded_at is taken
        # before the read so our entry never outlives the inner one.
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
