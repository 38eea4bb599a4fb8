"""The local-disk KV tier (L3): blocks the host tier evicts, kept in files under the same key.

It sits under the host tier (`HostTier.attach_lower`), which it extends the way the
host tier extends the device pool:

- write-down: an entry the host tier evicts for room is spilled here (a `spill` op:
  the executor copies the host slot's bytes and a background thread writes the file,
  so a step never waits for the disk); an expired entry is not;
- lookup: a miss in the host tier continues the caller's own chain here; the files of
  the hits are read and verified (digest, key, token ids, model fingerprint) at the
  lookup, before anything is promised to the device index, so a torn or corrupt file
  is a miss and never wrong tokens; a bad file is deleted;
- load: a verified block goes disk -> host memory (read at the lookup) -> device
  (`HostTier._promote`), only when the measured disk read plus a host-to-device copy
  is predicted cheaper than recomputing it.

Bookkeeping (per-domain LRU, tenant shares, TTLs) is the host tier's own, inherited:
a "slot" here is a unit of the disk budget, not a place in memory. Every entry that
leaves (for room, by TTL, or as a bad file) has its file deleted, so scrub-on-free
holds by construction and a restart never finds a block its budget dropped.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from engine.kv_cache.disk_format import BadBlockFile, BlockRecord, decode_block
from engine.kv_cache.disk_store import DiskStore
from engine.kv_cache.eviction import tenant_root
from engine.kv_cache.host_tier import HostTier, TierEntry, TierOp
from engine.kv_cache.prefix_index import Chunk
from engine.kv_cache.tier_cost import DiskLoadCost

log = logging.getLogger("engine")


def wall_time() -> float:
    """The wall clock the files' ages are kept in (a restart has another monotonic one)."""
    return time.time()


class DiskTier(HostTier):
    """The disk tier's bookkeeping over `num_slots` files of `bytes_per_block` payload."""

    def __init__(
        self,
        num_slots: int,
        bytes_per_block: int,
        store: DiskStore,
        *,
        ttl_of: Callable[[str], float | None] = lambda _d: None,
        scrub_of: Callable[[str], bool] = lambda _d: False,
        clock: Callable[[], float] = time.monotonic,
        cost: DiskLoadCost | None = None,
        medium: str = "DISK",
    ) -> None:
        super().__init__(
            num_slots, bytes_per_block, ttl_of=ttl_of, scrub_of=scrub_of, medium=medium
        )
        self.files = store
        self.cost = cost
        self._clock = clock
        # Verified payloads of the last `match`, by key, until `take_staged` or the next
        # match (the manager loads a match's blocks before it looks anything else up).
        self._staged: dict[bytes, tuple[Chunk, str, memoryview]] = {}

    # -- restart -------------------------------------------------------------------

    def adopt(self, records: Iterable[BlockRecord]) -> int:
        """Indexes the blocks a previous engine left in the directory, oldest first;
        those over the budget are deleted. Returns how many were kept. Called before
        the tier is attached under the host tier (it runs its own deletions)."""
        now, wall = self._clock(), wall_time()
        for rec in sorted(records, key=lambda r: r.wall_time):
            if rec.key in self._by_key:
                continue
            # Over budget (a smaller kv_disk_bytes than last time): room is made as
            # for a write, so the newest blocks stay within the tenants' shares.
            if not self._free and not self._make_room(tenant_root(rec.domain)):
                self.files.delete(rec.key)
                continue
            slot = self._free.pop()
            self._tick += 1
            last_used = now - max(0.0, wall - rec.wall_time)
            self._by_key[rec.key] = TierEntry(slot, rec.chunk, rec.domain, last_used, self._tick)
            self._lru.setdefault(rec.domain, OrderedDict())[rec.key] = None
            root = tenant_root(rec.domain)
            self._per_tenant[root] = self._per_tenant.get(root, 0) + 1
        # Deletions for room above are ops like any other: run them now, at start.
        for op in self.take_ops():
            if op.kind == "delete" and op.record is not None:
                self.files.delete(op.record.key)
        return len(self._by_key)

    # -- write-down ----------------------------------------------------------------

    def store(self, key: bytes, chunk: Chunk, domain: str, last_used: float, block: int) -> bool:
        """Spills host slot `block` under `key`; refused once a write has failed."""
        if self.store_failed():
            self.counters.refused += 1
            return False
        return super().store(key, chunk, domain, last_used, block)

    def store_failed(self) -> bool:
        """True once the disk refused a write (the store warned, once): the tier writes
        nothing more, and keeps serving the blocks already on disk."""
        return self.files.failed

    def _queue_write(self, key: bytes, entry: TierEntry, source: int) -> None:
        # The file carries the wall time of the block's last use, so that a restarted
        # engine (another monotonic clock) applies the domain's TTL from the same age.
        age = max(0.0, self._clock() - entry.last_used)
        record = BlockRecord(key, entry.chunk, entry.domain, wall_time() - age)
        self._ops.append(TierOp("spill", -1, source, record=record))

    def _queue_drop(self, key: bytes, entry: TierEntry) -> None:
        # Every entry that leaves loses its file: what the budget, a TTL or a scrub drops
        # is gone from the disk too, and a restart cannot bring it back.
        record = BlockRecord(key, entry.chunk, entry.domain, 0.0)
        self._ops.append(TierOp("delete", -1, -1, record=record))
        # A staged payload stays until the next match: its entry may be dropped for
        # room by the very promotions of its chain, and it was verified already.

    # -- lookup and load -----------------------------------------------------------

    def match(self, keys: Sequence[bytes], chunks: Sequence[Chunk], now: float) -> list[int]:
        """Slots of the leading blocks held here whose files read back intact; reads
        them only when loading that run is predicted cheaper than recomputing it."""
        self._staged.clear()
        self.counters.lookups += 1
        run = self._held_run(keys, chunks, now)
        if not run:
            return []
        self.counters.hits += 1
        self.counters.hit_blocks += len(run)
        if self.cost is not None and not self.cost.worth_loading(len(run)):
            self.counters.recomputed_instead += len(run)
            return []
        good: list[int] = []
        for slot, key, chunk in zip(run, keys, chunks, strict=False):
            payload = self._read(key, chunk)
            if payload is None:
                self.counters.bad_files += 1
                self._drop(key)
                break
            entry = self._by_key[key]
            self._staged[key] = (chunk, entry.domain, payload)
            good.append(slot)
        return good

    def _read(self, key: bytes, chunk: Chunk) -> memoryview | None:
        started = time.perf_counter()
        data = self.files.read(key)
        if data is None:
            return None
        try:
            record, payload = decode_block(data, self.files.fingerprint, key, self.bytes_per_block)
        except BadBlockFile as exc:
            # Warned once (a failing disk would flood the log); counted in bad_files.
            level = logging.WARNING if not self.counters.bad_files else logging.DEBUG
            log.log(level, "disk KV tier: dropping block file %s (%s)", key.hex()[:16], exc)
            return None
        if record.chunk != chunk:
            return None  # a hash collision would land here: never serve other tokens
        seconds = time.perf_counter() - started
        # The read is the first leg of this tier's load (the copy up is timed at the copy).
        self.counters.load_time_s += seconds
        if self.cost is not None:
            self.cost.observe_read(len(data), seconds)
        return payload

    def take_staged(self, key: bytes, chunk: Chunk) -> tuple[str, memoryview] | None:
        """(domain, payload) of a block the last `match` verified, once."""
        staged = self._staged.pop(key, None)
        if staged is None or staged[0] != chunk:
            return None
        return staged[1], staged[2]

    def promoted(self, key: bytes, now: float) -> None:
        """A matched block was loaded to the device: it stays here, now the newest."""
        entry = self._by_key.get(key)
        if entry is not None:
            self._touch(key, entry, now)
        self.counters.loads += 1

    def check_integrity(self) -> None:
        """The inherited bookkeeping checks; staged payloads belong to held entries."""
        super().check_integrity()
        if any(len(p) != self.bytes_per_block for _c, _d, p in self._staged.values()):
            raise AssertionError("a staged disk block has the wrong size")
