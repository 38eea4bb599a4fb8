"""Reads (and for retention, sets) state of the KV cache manager and the radix index
that only tests look at; the production classes carry no members for it."""

from __future__ import annotations

from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.radix_index import RadixIndex


def cached_block_ids(kv: KVCacheManager) -> set[int]:
    """Every registered block."""
    return set(kv._meta)


def block_domain(kv: KVCacheManager, block_id: int) -> str | None:
    """The domain a registered block belongs to (`eviction.PUBLIC` for published)."""
    meta = kv._meta.get(block_id)
    return None if meta is None else meta.domain


def domain_map_sizes(kv: KVCacheManager) -> dict[str, int]:
    """Entries of each per-domain map (for tests that check they stay bounded)."""
    return {
        "keys": len(kv._keys),
        "live": len(kv._activity.live),
        "counters": len(kv._activity.counters),
        "idle_counters": len(kv._activity._idle),
        "cached": len(kv.ledger.cached),
        "idle": len(kv.ledger.idle),
        "heaps": len(kv.ledger._heaps),
    }


def ref_count(pool: BlockPool, block_id: int) -> int:
    """Current number of references to a block."""
    return pool._ref_counts[block_id]


def set_domain_retention(kv: KVCacheManager, domain: str, ttl_s: float | None) -> None:
    """Overrides how long idle cached blocks of `domain` are kept."""
    kv.ledger.set_ttl(domain, ttl_s)


def num_nodes(index: RadixIndex) -> int:
    """Nodes in all of a radix index's trees, roots excluded."""
    return len({id(n) for n in index._node_of.values()})
