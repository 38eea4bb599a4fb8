"""Which idle cached block to evict: LRU over leaves, per domain, above each domain's floor.

Bookkeeping only (no pool, no index): the manager reports blocks becoming idle or
in use, gaining or losing cached children, and asks for a victim. A block is a
candidate while it is idle, unpinned and has no cached children, so a chain is
evicted tail first and a lookup never finds a hole in the middle of a prefix.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

PUBLIC = "<public>"  # the ledger's name for the published-prefix domain


@dataclass(frozen=True)
class CachePolicy:
    """Retention rules for cached blocks, from `CacheConfig`.

    floor: a domain keeps max(min_cached_blocks, min_cached_share * pool) cached blocks
    that no other domain's traffic can evict. strict: no cross-domain eviction at all,
    and a domain caches at most its floor (a hard partition). retention_ttl_s: idle
    cached blocks older than this are dropped. scrub: zero blocks leaving a domain.
    """

    min_cached_blocks: int = 0
    min_cached_share: float = 0.0
    strict: bool = False
    retention_ttl_s: float | None = None
    scrub_freed_blocks: bool = False


class EvictionLedger:
    """Per-domain LRU heaps of candidate blocks, with cached and idle counts."""

    def __init__(self, num_blocks: int, policy: CachePolicy) -> None:
        self.num_blocks = num_blocks
        self.policy = policy
        self.cached: Counter[str] = Counter()
        self.idle: Counter[str] = Counter()
        self._floors: dict[str, int] = {}
        self._ttls: dict[str, float | None] = {}
        self._heaps: dict[str, list[tuple[int, int]]] = {}
        self._entry: dict[int, tuple[str, int]] = {}  # candidate block -> (domain, tick)
        self._last_used: dict[int, float] = {}

    # -- settings -------------------------------------------------------------------

    def set_floor(self, domain: str, blocks: int) -> None:
        """Overrides one domain's floor (blocks)."""
        self._floors[domain] = max(0, blocks)

    def set_ttl(self, domain: str, ttl_s: float | None) -> None:
        """Overrides one domain's retention."""
        self._ttls[domain] = ttl_s

    def floor(self, domain: str) -> int:
        """Cached blocks of `domain` that other domains cannot evict."""
        if domain in self._floors:
            return self._floors[domain]
        share = int(self.policy.min_cached_share * self.num_blocks)
        return max(self.policy.min_cached_blocks, share)

    def ttl(self, domain: str) -> float | None:
        """Seconds an idle cached block of `domain` is kept."""
        return self._ttls.get(domain, self.policy.retention_ttl_s)

    # -- candidates -----------------------------------------------------------------

    def add_candidate(self, block_id: int, domain: str, tick: int, now: float) -> None:
        """`block_id` is now idle, unpinned and childless."""
        self._entry[block_id] = (domain, tick)
        self._last_used[block_id] = now
        heap = self._heaps.setdefault(domain, [])
        heapq.heappush(heap, (tick, block_id))
        if len(heap) > 64 + 2 * self.idle[domain]:
            # Stale entries (revived blocks) would otherwise pile up between evictions.
            live = [(t, b) for t, b in heap if self._entry.get(b) == (domain, t)]
            heapq.heapify(live)
            self._heaps[domain] = live

    def drop_candidate(self, block_id: int) -> None:
        """`block_id` is in use again, gained a child, or was evicted (heap entry goes stale)."""
        self._entry.pop(block_id, None)
        self._last_used.pop(block_id, None)

    def is_candidate(self, block_id: int) -> bool:
        """True while the block may be evicted."""
        return block_id in self._entry

    def _top(self, domain: str) -> tuple[int, int] | None:
        heap = self._heaps.get(domain)
        while heap:
            tick, block_id = heap[0]
            if self._entry.get(block_id) == (domain, tick):
                return tick, block_id
            heapq.heappop(heap)
        return None

    def evictable_for(self, requester: str) -> int:
        """Idle blocks `requester` may reclaim: its own, plus other domains' above their floor."""
        total = 0
        for domain, idle in self.idle.items():
            if domain == PUBLIC or idle <= 0:
                continue
            if domain == requester:
                total += idle
            elif not self.policy.strict:
                total += max(0, min(idle, self.cached[domain] - self.floor(domain)))
        return total

    def victim(self, requester: str, *, ignore_floors: bool = False) -> int | None:
        """The least recently used candidate `requester` may evict, or None."""
        best: tuple[int, int] | None = None
        for domain in list(self._heaps):
            if domain == PUBLIC:
                continue
            protected = self.policy.strict or self.cached[domain] <= self.floor(domain)
            if domain != requester and not ignore_floors and protected:
                continue
            top = self._top(domain)
            if top is not None and (best is None or top < best):
                best = top
        return None if best is None else best[1]

    def own_victim(self, domain: str) -> int | None:
        """The least recently used candidate of `domain` itself."""
        top = self._top(domain)
        return None if top is None else top[1]

    def expired(self, now: float) -> list[int]:
        """Candidates idle for longer than their domain's retention, oldest first."""
        out: list[int] = []
        for domain in list(self._heaps):
            ttl = self.ttl(domain)
            if ttl is None or domain == PUBLIC:
                continue
            top = self._top(domain)
            if top is not None and self._last_used[top[1]] + ttl <= now:
                out.append(top[1])
        return out
