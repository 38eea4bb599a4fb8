"""KV-cache events in vLLM's format, so that llm-d's precise prefix-cache scorer (and
any subscriber of vLLM's events) can track which blocks each engine holds.

The messages are vLLM's `KVEventBatch` of tagged `BlockStored` / `BlockRemoved` /
`AllBlocksCleared` structs, encoded as msgpack arrays (msgspec's `array_like`, the tag
first). `BlockStored` carries two fields after vLLM's own: the block's cache domain
(the digest the gateway derives for a tenant, "public" for a published prefix) and
its LoRA adapter's name. They are typed and trailing, so a decoder built on vLLM's
structs reads our events and ignores them.

Block hashes are the engine's own chained block hashes (blake2b, 32 bytes), rooted
at the domain's cache key: the same tokens in two domains never share a hash, so a
subscriber's index keeps tenants apart as the engine's does.

`medium` says where a block is, as in vLLM: the device pool's "GPU" (or "CPU" for an
engine that runs on the CPU), the host tier's "CPU_HOST", the disk tier's "DISK". A
block written down to a tier below the device is announced stored there, and removed
there when the tier drops it (`tier_stored`, `tier_removed`), with the same hash as
on the device, so a tier-aware indexer (llm-d's) can weigh where each block is. Like
vLLM's offloading connector's, a tier's `BlockStored` names no parent (a tier keeps
blocks, not chains) and no adapter; it carries the block's tokens and domain.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from engine.kv_cache.cache_key import block_hash
from engine.kv_cache.prefix_index import BlockKey


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Events of one engine step, with the wall-clock time they were taken."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """One change to the engine's prefix cache."""


class BlockStored(KVCacheEvent):
    """Full blocks became cached: `block_hashes` chain on from `parent_block_hash`
    (None: the first block of its domain's chain), `token_ids` are theirs in order."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    cache_domain: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted."""

    block_hashes: list[bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    """Every cached block is gone (an engine that starts holds none)."""


class KVEventBatch(EventBatch):
    """vLLM's batch of KV-cache events."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class KVEventLog:
    """Collects the events of a prefix cache between two `take`s; a block stored (or
    removed) right after the previous one of its chain extends that event.

    It keeps the hash each cached block was announced under, so that its eviction can
    be announced by block id alone.
    """

    def __init__(self, block_size: int, medium: str) -> None:
        self.block_size = block_size
        self.medium = medium
        self._events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        self._hashes: dict[int, bytes] = {}  # cached block id -> its announced hash

    @property
    def num_announced(self) -> int:
        """Blocks announced stored and not yet removed."""
        return len(self._hashes)

    def stored(
        self,
        block: int,
        parent: int | None,
        root: bytes,
        token_ids: tuple[int, ...],
        key: BlockKey,
        domain: str,
        adapter: str | None,
    ) -> None:
        """Block `block` (after `parent`, None: first of its chain under `root`) became
        cached. Its hash is the index's own key in hash mode; in radix mode (the tree keys
        by tokens) the same chained hash, computed here."""
        parent_hash = None if parent is None else self._hashes.get(parent)
        if isinstance(key, bytes):
            this = key
        else:
            this = block_hash(parent_hash if parent_hash is not None else root, token_ids)
        self._hashes[block] = this
        last = self._events[-1] if self._events else None
        if (
            isinstance(last, BlockStored)
            and last.medium == self.medium
            and last.block_hashes[-1] == parent_hash
            and last.cache_domain == domain
            and last.lora_name == adapter
        ):
            last.block_hashes.append(this)
            last.token_ids.extend(token_ids)
            return
        self._events.append(
            BlockStored(
                block_hashes=[this],
                parent_block_hash=parent_hash,
                token_ids=list(token_ids),
                block_size=self.block_size,
                lora_id=None,
                medium=self.medium,
                cache_domain=domain,
                lora_name=adapter,
            )
        )

    def removed(self, block: int) -> None:
        """Cached block `block` was evicted (a block never announced is skipped)."""
        announced = self._hashes.pop(block, None)
        if announced is None:
            return
        self._append_removed(announced, self.medium)

    def _append_removed(self, block_hash: bytes, medium: str) -> None:
        """Removals of one medium in a row go in one event (a set, in no order)."""
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved) and last.medium == medium:
            last.block_hashes.append(block_hash)
            return
        self._events.append(BlockRemoved(block_hashes=[block_hash], medium=medium))

    def tier_stored(self, key: bytes, token_ids: tuple[int, ...], domain: str, medium: str) -> None:
        """A block was written down to the tier of `medium` under its chained hash `key`.
        One event per block: a tier's write-downs in a row are not one chain."""
        self._events.append(
            BlockStored(
                block_hashes=[key],
                parent_block_hash=None,
                token_ids=list(token_ids),
                block_size=self.block_size,
                lora_id=None,
                medium=medium,
                cache_domain=domain,
            )
        )

    def tier_removed(self, key: bytes, medium: str) -> None:
        """The tier of `medium` dropped the block of chained hash `key`."""
        self._append_removed(key, medium)

    def cleared(self) -> None:
        """The whole cache is empty."""
        self._events = [AllBlocksCleared()]

    def take(self) -> KVEventBatch | None:
        """The events since the last take, as one batch (None: there were none)."""
        if not self._events:
            return None
        events, self._events = self._events, []
        return KVEventBatch(ts=time.time(), events=events)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack bytes of a batch, as vLLM's publisher sends them."""
    return msgspec.msgpack.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its msgpack bytes (`msgspec.ValidationError` when malformed)."""
    return msgspec.msgpack.decode(payload, type=KVEventBatch)
