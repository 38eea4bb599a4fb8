"""Sizing and attaching the host tier (L2), and the disk tier (L3) under it, at start-up."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import CacheConfig
from engine.kv_cache.disk_format import DIGEST_BYTES, FIXED_BYTES, model_fingerprint
from engine.kv_cache.disk_store import LOCK_NAME, DiskStore
from engine.kv_cache.disk_tier import DiskTier
from engine.kv_cache.host_buffer import HostKVBuffer
from engine.kv_cache.host_tier import HostTier
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.sizing import available_memory_bytes
from engine.kv_cache.tier_cost import DiskLoadCost, LoadCostRule

log = logging.getLogger("engine")


@dataclass(frozen=True)
class HostTierParts:
    """What the engine keeps of an attached host tier: the host copies and the cost rule."""

    buffer: HostKVBuffer
    cost: LoadCostRule
    disk: DiskTier | None = None  # the disk tier (L3) under the host tier, if on


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
        _warn_disk_without_host(cache)
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
        _warn_disk_without_host(cache)
        return None
    tier = HostTier(slots, bytes_per_block, ttl_of=kv.ledger.ttl, scrub_of=kv.ledger.scrub)
    buffer = HostKVBuffer(kv_caches, slots)
    cost = LoadCostRule(bytes_per_block, cache.block_size)
    buffer.probe_bandwidth(cost)
    # At shutdown the tier spills to disk outside a step: it runs its ops itself.
    tier.executor = lambda ops: buffer.execute(ops, cost)
    kv.attach_tier(tier, cost)
    log.info(
        "host KV tier: %d blocks = %d tokens (%.1f MiB)%s",
        slots,
        slots * cache.block_size,
        slots * bytes_per_block / 2**20,
        ", pinned" if buffer.pinned else "",
    )
    disk = attach_disk_tier(cache, kv, tier, buffer, cost)
    return HostTierParts(buffer, cost, disk)


def _warn_disk_without_host(cache: CacheConfig) -> None:
    if cache.kv_disk_path is not None and cache.kv_disk_bytes > 0:
        log.warning("kv_disk_path is ignored: the disk tier needs the host tier, which is off")


def disk_file_bytes(payload: int, block_size: int) -> int:
    """What one block file takes on disk, for the budget (a domain of up to 64 bytes)."""
    return FIXED_BYTES + 8 * block_size + 64 + payload + DIGEST_BYTES


def attach_disk_tier(
    cache: CacheConfig,
    kv: KVCacheManager,
    host: HostTier,
    buffer: HostKVBuffer,
    cost: LoadCostRule,
) -> DiskTier | None:
    """Puts the disk tier (L3) of `kv_disk_bytes` in `kv_disk_path` under the host tier,
    if asked for, with the blocks a previous engine of the same model left there.

    A path that is not a writable directory, one another live engine holds (its lock
    file, see `DiskStore.lock`), or a budget that holds no block, leaves the tier off; a
    budget larger than the free space is clamped to 80% of it (the space our own files
    take counted as free): each with one warning, never an error.
    """
    path, budget = cache.kv_disk_path, cache.kv_disk_bytes
    if path is None and budget <= 0:
        return None
    if path is None:
        log.warning("kv_disk_bytes=%d is ignored: kv_disk_path is not set", budget)
        return None
    if budget <= 0:
        log.warning("kv_disk_path=%s is ignored: kv_disk_bytes is 0 (the disk tier is off)", path)
        return None
    root = Path(path).expanduser()
    try:
        # Owner-only: the files hold other tenants' KV, whatever the umask.
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not root.is_dir():
            raise NotADirectoryError(f"{root} is not a directory")
    except OSError as exc:
        log.warning(
            "kv_disk_path=%s is not a usable directory (%s): the disk tier is off", path, exc
        )
        return None
    payload = buffer.bytes_per_block
    first = buffer.device_caches[0]
    layout = (len(buffer.device_caches), tuple(first.shape[2:]), str(first.dtype), cache.block_size)
    store = DiskStore(root, model_fingerprint(kv.revision, layout), payload)
    try:
        # Before anything reads or deletes a file: the directory may be another live
        # engine's, whose files are not ours to scan, adopt or delete.
        locked = store.lock()
        if not locked:
            store.close()
            log.warning(
                "kv_disk_path=%s is in use by another engine (%s is locked): the disk tier is off",
                path,
                root / LOCK_NAME,
            )
            return None
        probes = store.probe_read()
        records = store.scan()
        free = shutil.disk_usage(root).free
    except OSError as exc:
        store.close()
        log.warning("kv_disk_path=%s cannot be written (%s): the disk tier is off", path, exc)
        return None
    per_file = disk_file_bytes(payload, cache.block_size)
    room = free + len(records) * per_file  # our own files' space is ours to reuse
    if budget > room:
        clamped = int(room * 0.8)
        log.warning(
            "kv_disk_bytes=%d exceeds the free space in kv_disk_path=%s (%d bytes); "
            "the disk KV tier is clamped to %d bytes",
            budget,
            path,
            room,
            clamped,
        )
        budget = clamped
    slots = budget // per_file
    if slots < 1:
        store.close()
        log.warning(
            "kv_disk_bytes=%d holds no KV block (%d bytes each): the disk tier is off",
            budget,
            per_file,
        )
        return None
    disk_cost = DiskLoadCost(cost, payload)
    for num_bytes, seconds in probes:
        disk_cost.observe_read(num_bytes, seconds)
    disk = DiskTier(
        slots,
        payload,
        store,
        ttl_of=kv.ledger.ttl,
        scrub_of=kv.ledger.scrub,
        clock=lambda: kv.clock(),  # late-bound: tests move the manager's clock
        cost=disk_cost,
    )
    kept = disk.adopt(records)
    store.flush()
    host.attach_lower(disk)
    buffer.disk = store
    log.info(
        "disk KV tier in %s: %d blocks = %d tokens (%.1f MiB), %d found from a previous run",
        root,
        slots,
        slots * cache.block_size,
        slots * per_file / 2**20,
        kept,
    )
    return disk
