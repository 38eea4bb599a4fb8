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


def tenant_root(domain: str) -> str:
    """The tenant a cache domain belongs to: its first path element ("t:a" of "t:a/k:1")."""
    return domain.split("/", 1)[0]


@dataclass(frozen=True)
class CachePolicy:
    """Retention rules for cached blocks, from `CacheConfig`.

    floor: a domain keeps max(min_cached_blocks, min_cached_share * pool) cached blocks
    that no other domain's traffic can evict. strict: no cross-domain eviction at all,
    and a domain caches at most its floor (a hard partition). retention_ttl_s: idle
    cached blocks older than this are dropped. scrub: zero blocks leaving a domain.

    fair_cached_share: the default floor against eviction floods. That share of the
    pool is split evenly among the tenants caching blocks (a tenant is a domain's root:
    "t:a" for "t:a" and "t:a/k:1"), and another tenant's traffic never evicts a
    tenant's idle cached blocks while it has no more of them than its part. It is
    counted per tenant, not per domain, so that a tenant with many domains protects no
    more than one with one, and all the parts together never exceed the share.
    """

    min_cached_blocks: int = 0
    min_cached_share: float = 0.0
    fair_cached_share: float = 0.0
    strict: bool = False
    retention_ttl_s: float | None = None
    scrub_freed_blocks: bool = False


class EvictionLedger:
    """Per-domain LRU heaps of candidate blocks, with cached and idle counts.

    Per-domain settings resolve in order: an exact override (`set_ttl`),
    the rule of the longest matching root (`set_rules`), then the policy's default.
    The counts and heaps of a domain are dropped (`forget`) once it caches nothing.
    """

    def __init__(self, num_blocks: int, policy: CachePolicy) -> None:
        self.num_blocks = num_blocks
        self.policy = policy
        self.cached: Counter[str] = Counter()
        self.idle: Counter[str] = Counter()
        self._ttls: dict[str, float | None] = {}
        self._rules: dict[str, DomainRule] = {}
        self.has_ttls = policy.retention_ttl_s is not None  # whether any idle block may expire
        self._heaps: dict[str, list[tuple[int, int]]] = {}
        self._entry: dict[int, tuple[str, int]] = {}  # candidate block -> (domain, tick)
        self._last_used: dict[int, float] = {}

    # -- settings -------------------------------------------------------------------

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

    def fair_floors(self) -> tuple[int, dict[str, int]]:
        """The default floor of each tenant (blocks), and each tenant's idle cached blocks.

        The floor is `fair_cached_share` of the pool over the tenants caching blocks now.
        """
        idle_by_root: dict[str, int] = {}
        roots: set[str] = set()
        for domain, n in self.cached.items():
            if domain != PUBLIC and n > 0:
                roots.add(tenant_root(domain))
        for domain, n in self.idle.items():
            if domain != PUBLIC and n > 0:
                root = tenant_root(domain)
                idle_by_root[root] = idle_by_root.get(root, 0) + n
        share = self.policy.fair_cached_share
        if share <= 0 or not roots:
            return 0, idle_by_root
        return int(share * self.num_blocks / len(roots)), idle_by_root

    def evictable_for(self, requester: str) -> int:
        """Idle blocks `requester` may reclaim: its own, plus other domains' above their
        floor and other tenants' above their default floor."""
        fair, idle_by_root = self.fair_floors()
        own_root = tenant_root(requester)
        per_root: dict[str, int] = {}
        total = 0
        for domain, idle in self.idle.items():
            if domain == PUBLIC or idle <= 0:
                continue
            if domain == requester:
                total += idle
            elif not self.policy.strict:
                free = max(0, min(idle, self.cached[domain] - self.floor(domain)))
                root = tenant_root(domain)
                if root == own_root:
                    total += free
                else:
                    per_root[root] = per_root.get(root, 0) + free
        for root, free in per_root.items():
            total += min(free, max(0, idle_by_root.get(root, 0) - fair))
        return total

    def victim(self, requester: str, *, ignore_floors: bool = False) -> int | None:
        """The least recently used candidate `requester` may evict, or None."""
        fair, idle_by_root = self.fair_floors() if not ignore_floors else (0, {})
        own_root = tenant_root(requester)
        best: tuple[int, int] | None = None
        for domain in list(self._heaps):
            if domain == PUBLIC:
                continue
            protected = self.policy.strict or self.cached[domain] <= self.floor(domain)
            root = tenant_root(domain)
            if fair and root != own_root and idle_by_root.get(root, 0) <= fair:
                protected = True
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
