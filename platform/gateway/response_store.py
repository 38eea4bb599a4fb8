"""Stored `/v1/responses`: what `previous_response_id`, GET and DELETE read.

The routes see a `ResponseRepository` (async): `InMemoryResponses` over this module's
`ResponseStore`, one per gateway process, or, when gateways share a Redis, the shared
one of gateway.response_store_redis, so that any replica finds a response another
stored. `ResponseStore` is in memory, one per gateway app. Every entry
belongs to one tenant, and a lookup names the tenant: another tenant's id reads
exactly like an unknown one. Entries expire `ttl_s` after they were stored.

Every entry is counted by its whole serialized record (`record_json`: the conversation,
function-call arguments included, and the response body with its instructions, tools,
tool_choice and output), the same bytes Redis stores. One record is at most
`max_record_bytes`. Each tenant has its own caps, entries (`max_per_tenant`) and bytes
(`max_bytes_per_tenant`): past them the tenant's OWN oldest entries go. The store-wide
caps (`max_entries`, `max_bytes`) never evict another tenant's entry (issue 46): a
tenant makes room among its own entries only, and when the rest of the store is other
tenants', the new entry is refused (`put` answers False, and the route answers
`store: false`).

The TTL is the same for every entry, so insertion order is expiry order: one
ordered map serves both the TTL and the oldest-first eviction.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

# A conversation turn as the chat template takes it ({"role", "content", ...}).
Turn = Mapping[str, Any]


def record_json(conversation: Sequence[Turn], body: str) -> str:
    """The stored record as one JSON text (ASCII: its length is its size in bytes)."""
    return json.dumps({"conversation": list(conversation), "body": body})


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its owner, the conversation it ends and its JSON body."""

    response_id: str
    tenant_id: str
    conversation: tuple[Turn, ...]  # every turn up to and including this response's output
    body: str  # the response object, as GET returns it

    @cached_property
    def size(self) -> int:
        """What the entry counts against every byte cap: its serialized record's bytes."""
        return len(record_json(self.conversation, self.body))


class ResponseStore:
    """A bounded, expiring, tenant-scoped map of response id -> StoredResponse."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_entries: int,
        max_per_tenant: int,
        max_bytes: int,
        max_bytes_per_tenant: int,
        max_record_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._max_per_tenant = max_per_tenant
        self._max_bytes = max_bytes
        self._max_bytes_per_tenant = max_bytes_per_tenant
        self._max_record_bytes = max_record_bytes
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self._expiry: dict[str, float] = {}
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        """Entries held (expired ones may linger until the next put or get)."""
        return len(self._entries)

    def put(self, entry: StoredResponse) -> bool:
        """Stores `entry` (expiring after the TTL); True when it was stored.

        Past a cap only the tenant's own oldest entries are evicted. An entry over a
        per-record or per-tenant cap, or one that would need another tenant's entries
        evicted to fit the store-wide caps, is not stored (False).
        """
        size = entry.size
        if size > min(self._max_record_bytes, self._max_bytes_per_tenant, self._max_bytes):
            return False
        self._expire()
        tenant = entry.tenant_id
        held = self._entries.get(entry.response_id)
        if held is not None and held.tenant_id != tenant:
            return False  # never replace another tenant's entry
        own = self._by_tenant.get(tenant, OrderedDict())
        own_bytes = self._tenant_bytes.get(tenant, 0)
        others_entries = len(self._entries) - len(own)
        others_bytes = self._bytes - own_bytes
        if others_entries + 1 > self._max_entries or others_bytes + size > self._max_bytes:
            return False  # the rest of the store is other tenants': theirs are never evicted
        if held is not None:  # a new version of the tenant's own entry
            own_bytes -= held.size
            self._drop(entry.response_id)
        while own and (
            len(own) + 1 > self._max_per_tenant
            or own_bytes + size > self._max_bytes_per_tenant
            or len(self._entries) + 1 > self._max_entries
            or self._bytes + size > self._max_bytes
        ):
            oldest = next(iter(own))
            own_bytes -= self._entries[oldest].size
            self._drop(oldest)
        self._entries[entry.response_id] = entry
        self._expiry[entry.response_id] = self._clock() + self._ttl_s
        self._by_tenant.setdefault(tenant, OrderedDict())[entry.response_id] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self._bytes += size
        return True

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

    def tenant_bytes(self, tenant_id: str) -> int:
        """The bytes of the tenant's entries held now."""
        return self._tenant_bytes.get(tenant_id, 0)

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            oldest = next(iter(self._entries))
            if self._expiry[oldest] > now:
                return
            self._drop(oldest)

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return
        del self._expiry[response_id]
        self._bytes -= entry.size
        tenant = entry.tenant_id
        own = self._by_tenant[tenant]
        del own[response_id]
        self._tenant_bytes[tenant] -= entry.size
        if not own:
            del self._by_tenant[tenant]
            del self._tenant_bytes[tenant]

    def check_integrity(self) -> None:
        """Asserts the indexes agree: per-tenant ids partition the entries, sizes add up."""
        assert sum(len(ids) for ids in self._by_tenant.values()) == len(self._entries)
        assert set(self._tenant_bytes) == set(self._by_tenant)
        for tenant_id, ids in self._by_tenant.items():
            assert ids, "no empty tenant index is kept"
            assert all(self._entries[i].tenant_id == tenant_id for i in ids)
            assert len(ids) <= self._max_per_tenant
            assert self._tenant_bytes[tenant_id] == sum(self._entries[i].size for i in ids)
            assert self._tenant_bytes[tenant_id] <= self._max_bytes_per_tenant
        assert len(self._entries) <= self._max_entries
        assert self._bytes == sum(e.size for e in self._entries.values())
        assert self._bytes <= self._max_bytes
        assert all(e.size <= self._max_record_bytes for e in self._entries.values())
        assert list(self._expiry) == list(self._entries)
        expiries = list(self._expiry.values())
        assert expiries == sorted(expiries), "insertion order is expiry order"


class ResponseRepository(Protocol):
    """Where the routes keep stored responses; a lookup always names the tenant."""

    async def put(self, entry: StoredResponse) -> bool:
        """Stores `entry`; False when it was not stored (over a cap, or the store failed:
        the repository logs a failure, never raises it). The route then answers
        `store: false`."""

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

    async def put(self, entry: StoredResponse) -> bool:
        """See `ResponseStore.put`."""
        return self.store.put(entry)

    async def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """See `ResponseStore.get`."""
        return self.store.get(tenant_id, response_id)

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        """See `ResponseStore.delete`."""
        return self.store.delete(tenant_id, response_id)

    async def close(self) -> None:
        """Nothing to release."""
