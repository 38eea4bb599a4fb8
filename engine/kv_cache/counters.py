"""Per-domain prefix-cache counters, ready to be exported as labelled metrics."""

from __future__ import annotations

from dataclasses import dataclass


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
