"""The KV cache manager's consistency check (tests and the fuzzers call it after each step).

It reads the manager's private bookkeeping on purpose: it is the manager's own
invariant, kept apart only so that the manager's module holds the behaviour.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from engine.kv_cache.eviction import PUBLIC

if TYPE_CHECKING:
    from engine.kv_cache.manager import KVCacheManager


def check_manager_integrity(manager: KVCacheManager) -> None:
    """Pool, index, ledger and the host tier (if any) agree about every cached block."""
    manager.pool.check_integrity()
    if manager.index is None:
        return
    manager.index.check_integrity()
    if len(manager.index) != len(manager._meta):
        raise AssertionError("index and manager disagree on the cached blocks")
    children: dict[int, int] = dict.fromkeys(manager._meta, 0)
    idle: dict[str, int] = {}
    cached: dict[str, int] = {}
    for b, meta in manager._meta.items():
        if not manager.pool.is_cached(b):
            raise AssertionError(f"block {b} is registered but not flagged cached")
        if meta.parent is not None:
            children[meta.parent] += 1
        cached[meta.domain] = cached.get(meta.domain, 0) + 1
        if manager.pool.is_idle(b):
            idle[meta.domain] = idle.get(meta.domain, 0) + 1
    for b, meta in manager._meta.items():
        if children[b] != meta.children:
            raise AssertionError(f"block {b} child count is off")
        should = manager.pool.is_idle(b) and meta.children == 0
        if should != manager.ledger.is_candidate(b):
            raise AssertionError(f"block {b} candidate flag is off")
    if {d: n for d, n in manager.ledger.idle.items() if n} != idle:
        raise AssertionError("idle counts are off")
    if {d: n for d, n in manager.ledger.cached.items() if n} != cached:
        raise AssertionError("cached counts are off")
    public = {b for b, meta in manager._meta.items() if meta.domain == PUBLIC}
    if public != manager._public or not manager._pinned <= public:
        raise AssertionError("the public block set is off")
    for b in public:
        if (b in manager._pinned) != manager._published.covers(
            manager._meta[b].prefix, manager._meta[b].depth
        ):
            raise AssertionError(f"public block {b} is pinned against the published set")
        if b not in manager._pinned and manager.ledger.is_candidate(b):
            raise AssertionError(f"withdrawn block {b} is idle but still cached")
    if manager.tier is not None:
        manager.tier.check_integrity()
        for b, meta in manager._meta.items():
            # Every block of a tenant's chain can be written down, under its own key.
            if meta.domain != PUBLIC and (
                not meta.tier_key or len(meta.chunk) != manager.block_size
            ):
                raise AssertionError(f"cached block {b} has no host tier key")
    live = Counter(st.domain for st in manager._seqs.values())
    if live != manager._activity.live:
        raise AssertionError("live sequence counts are off")
