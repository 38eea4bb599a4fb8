"""Which idle cached block to evict: LRU over leaves, per domain, above each domain's floor.

Bookkeeping only (no pool, no index): the manager reports blocks becoming idle or
in use, gaining or losing cached children, and asks for a victim. A block is a
candidate while it is idle, unpinned and has no cached children, so a chain is
evicted tail first and a lookup never finds a hole in the middle of a prefix.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from engine.kv_cache.cache_rules import DomainRule, match_rule

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
    """Per-domain LRU heaps of candidate blocks, with cached and idle counts.

    Per-domain settings resolve in order: an exact override (`set_floor`, `set_ttl`),
    the rule of the longest matching root (`set_rules`), then the policy's default.
    The counts and heaps of a domain are dropped (`forget`) once it caches nothing.
    """

    def __init__(self, num_blocks: int, policy: CachePolicy) -> None:
        self.num_blocks = num_blocks
        self.policy = policy
        self.cached: Counter[str] = Counter()
        self.idle: Counter[str] = Counter()
        self._floors: dict[str, int] = {}
        self._ttls: dict[str, float | None] = {}
        self._rules: dict[str, DomainRule] = {}
        self.has_ttls = policy.retention_ttl_s is not None  # whether any idle block may expire
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
        self._update_has_ttls()

    def set_rules(self, rules: Mapping[str, DomainRule]) -> None:
        """Replaces the per-root rules (see `cache_rules.match_rule`)."""
        self._rules = dict(rules)
        self._update_has_ttls()

    def rule(self, domain: str) -> DomainRule | None:
        """The rule that applies to `domain`, if any (never one for `PUBLIC`)."""
        return None if domain == PUBLIC else match_rule(self._rules, domain)

    def _update_has_ttls(self) -> None:
        # Asked on every lookup: kept up to date here rather than computed there.
        self.has_ttls = (
            self.policy.retention_ttl_s is not None
            or any(t is not None for t in self._ttls.values())
            or any(r.retention_ttl_s is not None for r in self._rules.values())
        )

    def floor(self, domain: str) -> int:
        """Cached blocks of `domain` that other domains cannot evict."""
        if domain in self._floors:
            return self._floors[domain]
        rule = self.rule(domain)
        if rule is not None and rule.has_floor:
            return rule.floor(self.num_blocks)
        share = int(self.policy.min_cached_share * self.num_blocks)
        return max(self.policy.min_cached_blocks, share)

    def ttl(self, domain: str) -> float | None:
        """Seconds an idle cached block of `domain` is kept."""
        if domain in self._ttls:
            return self._ttls[domain]
        rule = self.rule(domain)
        if rule is not None and rule.retention_ttl_s is not None:
            return rule.retention_ttl_s
        return self.policy.retention_ttl_s

    def scrub(self, domain: str) -> bool:
        """Whether blocks leaving `domain` are zeroed before reuse."""
        rule = self.rule(domain)
        if rule is not None and rule.scrub_freed_blocks is not None:
            return rule.scrub_freed_blocks
        return self.policy.scrub_freed_blocks

    def forget(self, domain: str) -> None:
        """Drops the counts and heap of a domain that caches nothing (bounded maps)."""
        if self.cached[domain] or self.idle[domain]:
            raise AssertionError(f"forget of domain {domain!r}, which still caches blocks")
        self.cached.pop(domain, None)
        self.idle.pop(domain, None)
        # Its heap holds stale entries only: every candidate is a cached block.
        self._heaps.pop(domain, None)

    def map_sizes(self) -> dict[str, int]:
        """Entries of each per-domain map."""
        return {"cached": len(self.cached), "idle": len(self.idle), "heaps": len(self._heaps)}

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
