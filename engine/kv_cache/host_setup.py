"""Sizing and attaching the host tier (L2) under an engine's KV pool at start-up."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.config import CacheConfig
from engine.kv_cache.host_buffer import HostKVBuffer
from engine.kv_cache.host_tier import HostTier
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.sizing import available_memory_bytes
from engine.kv_cache.tier_cost import LoadCostRule

log = logging.getLogger("engine")


@dataclass(frozen=True)
class HostTierParts:
    """What the engine keeps of an attached host tier: the host copies and the cost rule."""

    buffer: HostKVBuffer
    cost: LoadCostRule


def attach_host_tier(
    cache: CacheConfig,
    kv: KVCacheManager,
    kv_caches: list[torch.Tensor],
    bytes_per_block: int,
) -> HostTierParts | None:
    """Puts the host tier (L2) of `kv_host_bytes` under the pool, if asked for.

    A budget larger than the host's available memory is clamped to 80% of it, and one
    too small for a block, or a cache with no prefix index, leaves the tier off: each
    with one warning, never an error once the engine serves.
    """
    budget = cache.kv_host_bytes
    if budget <= 0:
        return None
    if cache.prefix_cache == "off":
        log.warning("kv_host_bytes is ignored: the prefix cache is off")
        return None
    available = available_memory_bytes(torch.device("cpu"))
    if budget > available:
        clamped = int(available * 0.8)
        log.warning(
            "kv_host_bytes=%d exceeds the host's available memory (%d bytes); "
            "the host KV tier is clamped to %d bytes",
            budget,
            available,
            clamped,
        )
        budget = clamped
    slots = budget // bytes_per_block
    if slots < 1:
        log.warning(
            "kv_host_bytes=%d holds no KV block (%d bytes each): the host tier is off",
            budget,
            bytes_per_block,
        )
        return None
    tier = HostTier(slots, bytes_per_block, ttl_of=kv.ledger.ttl, scrub_of=kv.ledger.scrub)
    buffer = HostKVBuffer(kv_caches, slots)
    cost = LoadCostRule(bytes_per_block, cache.block_size)
    buffer.probe_bandwidth(cost)
    kv.attach_tier(tier, cost)
    log.info(
        "host KV tier: %d blocks = %d tokens (%.1f MiB)%s",
        slots,
        slots * cache.block_size,
        slots * bytes_per_block / 2**20,
        ", pinned" if buffer.pinned else "",
    )
    return HostTierParts(buffer, cost)
