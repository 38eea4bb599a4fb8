"""Stored `/v1/responses`: what `previous_response_id`, GET and DELETE read.

The routes see a `ResponseRepository` (async): `InMemoryResponses` over this module's
`ResponseStore`, one per gateway process, or, when gateways share a Redis, the shared
one of gateway.response_store_redis, so that any replica finds a response another
stored. `ResponseStore` is in memory, one per gateway app. Every entry
belongs to one tenant, and a lookup names the tenant: another tenant's id reads
exactly like an unknown one. Entries expire `ttl_s` after they were stored, and
the store is bounded three ways, each evicting the oldest entries first: all
entries, one tenant's entries (so one tenant cannot flush everyone else's), and
the characters of stored conversation (each entry keeps its whole conversation,
so a chain never depends on an ancestor that was evicted).

The TTL is the same for every entry, so insertion order is expiry order: one
ordered map serves both the TTL and the oldest-first eviction.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# A conversation turn as the chat template takes it ({"role", "content", ...}).
Turn = Mapping[str, Any]


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its owner, the conversation it ends and its JSON body."""

    response_id: str
    tenant_id: str
    conversation: tuple[Turn, ...]  # every turn up to and including this response's output
    body: str  # the response object, as GET returns it
    expires_at: float = 0.0  # set by the store

    @property
    def chars(self) -> int:
        """What the entry counts against the store's character cap."""
        return len(self.body) + sum(len(str(t.get("content") or "")) for t in self.conversation)


class ResponseStore:
    """A bounded, expiring, tenant-scoped map of response id -> StoredResponse."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_entries: int,
        max_per_tenant: int,
        max_chars: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._max_per_tenant = max_per_tenant
        self._max_chars = max_chars
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._chars = 0

    def __len__(self) -> int:
        """Entries held (expired ones may linger until the next put or get)."""
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        """Stores `entry` (stamped with its expiry), evicting the oldest past a cap.

        An entry larger than the whole character cap is not stored at all.
        """
        if entry.chars > self._max_chars:
            return
        self._expire()
        self._drop(entry.response_id)
        stamped = StoredResponse(
            response_id=entry.response_id,
            tenant_id=entry.tenant_id,
            conversation=entry.conversation,
            body=entry.body,
            expires_at=self._clock() + self._ttl_s,
        )
        self._entries[stamped.response_id] = stamped
        self._by_tenant.setdefault(stamped.tenant_id, OrderedDict())[stamped.response_id] = None
        self._chars += stamped.chars
        own = self._by_tenant[stamped.tenant_id]
        while len(own) > self._max_per_tenant:
            self._drop(next(iter(own)))
        while len(self._entries) > self._max_entries or self._chars > self._max_chars:
            self._drop(next(iter(self._entries)))

    def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """The tenant's live entry of that id; None if unknown, expired or another's."""
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or entry.tenant_id != tenant_id:
            return None
        return entry

    def delete(self, tenant_id: str, response_id: str) -> bool:
        """Removes the tenant's entry; False when `get` would have found nothing."""
        if self.get(tenant_id, response_id) is None:
            return False
        self._drop(response_id)
        return True

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.expires_at > now:
                return
            self._drop(oldest.response_id)

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return
        self._chars -= entry.chars
        own = self._by_tenant[entry.tenant_id]
        del own[response_id]
        if not own:
            del self._by_tenant[entry.tenant_id]

    def check_integrity(self) -> None:
        """Asserts the indexes agree: per-tenant ids partition the entries, sizes add up."""
        assert sum(len(ids) for ids in self._by_tenant.values()) == len(self._entries)
        for tenant_id, ids in self._by_tenant.items():
            assert ids, "no empty tenant index is kept"
            assert all(self._entries[i].tenant_id == tenant_id for i in ids)
            assert len(ids) <= self._max_per_tenant
        assert len(self._entries) <= self._max_entries
        assert self._chars == sum(e.chars for e in self._entries.values())
        assert self._chars <= self._max_chars
        expiries = [e.expires_at for e in self._entries.values()]
        assert expiries == sorted(expiries), "insertion order is expiry order"


class ResponseRepository(Protocol):
    """Where the routes keep stored responses; a lookup always names the tenant."""

    async def put(self, entry: StoredResponse) -> None:
        """Stores `entry` (a failure to store is the repository's to log, not to raise)."""

    async def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """The tenant's live entry of that id; None if unknown, expired or another's."""

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        """Removes the tenant's entry; False when `get` would have found nothing."""

    async def close(self) -> None:
        """Releases connections (at the app's shutdown)."""


class InMemoryResponses:
    """A `ResponseRepository` over one process's `ResponseStore`."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    async def put(self, entry: StoredResponse) -> None:
        """See `ResponseStore.put`."""
        self.store.put(entry)

    async def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """See `ResponseStore.get`."""
        return self.store.get(tenant_id, response_id)

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        """See `ResponseStore.delete`."""
        return self.store.delete(tenant_id, response_id)

    async def close(self) -> None:
        """Nothing to release."""
