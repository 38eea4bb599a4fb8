"""Per-domain prefix-cache counters, ready to be exported as labelled metrics, and the
bounded book of which domains are active that keeps them."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

# Counters of domains that went idle (nothing cached, no live sequence) are kept for
# the most recent ones only, so that a stream of one-off domains stays bounded.
IDLE_DOMAIN_COUNTERS = 1024


@dataclass
class DomainCounters:
    """Monotonic counters of one cache domain (mutable; owned by the KV cache manager)."""

    queries: int = 0  # lookups at admission
    hits: int = 0  # lookups that reused at least one block
    query_tokens: int = 0  # tokens looked up
    cached_tokens: int = 0  # tokens served from the cache
    evictions: int = 0  # blocks of this domain evicted

    def snapshot(self) -> DomainCacheStats:
        """A frozen copy for `EngineStats`."""
        return DomainCacheStats(
            self.queries, self.hits, self.query_tokens, self.cached_tokens, self.evictions
        )


@dataclass(frozen=True)
class DomainCacheStats:
    """A frozen snapshot of `DomainCounters` (plus, at the manager, the blocks cached now)."""

    queries: int
    hits: int
    query_tokens: int
    cached_tokens: int
    evictions: int
    cached_blocks: int = 0


class DomainActivity:
    """Live sequences and counters per domain, bounded: a domain's live count goes with
    its last sequence, and once it is idle its counters stay only while it is among the
    `keep_idle` most recently idle domains (owned by the KV cache manager)."""

    def __init__(self, keep_idle: int = IDLE_DOMAIN_COUNTERS) -> None:
        self.live: Counter[str] = Counter()  # sequences with a cache state, per domain
        self.counters: dict[str, DomainCounters] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # idle domains, oldest first
        self._keep_idle = keep_idle

    def counters_of(self, domain: str) -> DomainCounters:
        """The domain's counters, made on first use."""
        c = self.counters.get(domain)
        if c is None:
            c = self.counters[domain] = DomainCounters()
        return c

    def started(self, domain: str) -> None:
        """A sequence of `domain` got a cache state: the domain is active again."""
        self.live[domain] += 1
        self._idle.pop(domain, None)

    def ended(self, domain: str) -> bool:
        """A sequence of `domain` ended; True when it was the domain's last one."""
        self.live[domain] -= 1
        if self.live[domain] > 0:
            return False
        del self.live[domain]
        return True

    def retire(self, domain: str) -> None:
        """`domain` went idle: its counters join the idle ones, and the oldest idle
        domains' counters beyond `keep_idle` go."""
        if domain not in self.counters:
            return
        self._idle[domain] = None
        self._idle.move_to_end(domain)
        while len(self._idle) > self._keep_idle:
            oldest, _ = self._idle.popitem(last=False)
            self.counters.pop(oldest, None)

    def stats(self, cached: Mapping[str, int]) -> dict[str, DomainCacheStats]:
        """Each domain's counters, with the blocks `cached` says it holds now, by name."""
        domains = set(self.counters) | {d for d, n in cached.items() if n}
        out: dict[str, DomainCacheStats] = {}
        for d in sorted(domains):
            snap = self.counters.get(d, DomainCounters()).snapshot()
            out[d] = DomainCacheStats(
                snap.queries,
                snap.hits,
                snap.query_tokens,
                snap.cached_tokens,
                snap.evictions,
                cached.get(d, 0),
            )
        return out
