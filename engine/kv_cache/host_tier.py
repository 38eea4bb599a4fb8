"""The host-memory KV tier (L2): blocks the device pool evicts, kept under the same key.

Bookkeeping only, like the rest of `engine/kv_cache`: slots, keys, per-domain LRU,
shares and TTLs. The bytes live in `HostKVBuffer` (engine/kv_cache/host_buffer.py);
what this tier decides reaches them as an ordered list of `TierOp`s that the engine
executes before each step's forward pass, in the order they were issued (so a load
into a block always lands before a later write-back of that block reads it, and a
slot is zeroed before a later write-back reuses it). Loads run off the step's path
(engine/kv_cache/tier_copier.py): a block being loaded is held until its copy is in,
and the sequences over it sit the steps out until then (tier_loads.py).

Isolation: an entry is stored under the engine's own chained block hash, rooted at
the sequence's `CacheKey` (domain, adapter, revision), and a lookup continues the
caller's own chain: a key from another domain can never be asked for. Token ids are
compared on every hit, as in the device index, so even a hash collision could not
serve a wrong block.

Shares: when the tier is full, a tenant (a domain's root, see `eviction.tenant_root`)
at or over its fair share (slots / tenants holding entries) can only displace its own
least recently used entries; a tenant under its share displaces the LRU entry of the
tenant most over its share. A flood from one tenant therefore recycles its own slots
and leaves the others' share in place.

The disk tier (L3, engine/kv_cache/disk_tier.py) chains under this one
(`attach_lower`): what this tier evicts for room is spilled there, a miss here
continues the same chain there, and its ops share this tier's queue.

Counting: each tier counts only what it served itself. A lookup that misses the
device counts in this tier (`match`); its hits and hit blocks are the blocks found in
host memory. The part of the chain this tier lacks goes on to the disk tier, which
counts that lookup, and the blocks it finds on disk, in its own counters. Loads,
write-backs and "recomputed instead" are likewise per tier: a block fetched from disk
is a disk tier load, a host slot copied back a host tier load (`recomputed`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from engine.kv_cache.disk_format import BlockRecord
from engine.kv_cache.eviction import tenant_root
from engine.kv_cache.kv_events import KVEventLog
from engine.kv_cache.prefix_index import Chunk

if TYPE_CHECKING:
    from engine.kv_cache.disk_tier import DiskTier

# save: device block -> slot; load: slot -> device block; zero: scrub a slot. With a
# disk tier (L3) below: spill (slot -> a new block file), fetch (a verified file's
# payload -> device block) and delete (a block file).
TierOpKind = Literal["save", "load", "zero", "spill", "fetch", "delete"]
# Seconds between two scans that free the slots of expired entries. A lookup never
# serves an expired entry whatever the scan's period (`match` checks each hit's age).
EXPIRY_SCAN_S = 1.0
# Seconds a shutdown waits at most for the disk tier to take what the host tier holds
# (`HostTier.close`); what is left then is dropped, a miss for the next engine. Well
# under the 10 s a process engine's parent waits before it kills the child
# (engine/fronts/process_engine.py STOP_TIMEOUT_S).
CLOSE_DRAIN_S = 5.0


@dataclass(frozen=True)
class TierOp:
    """One copy the engine executes: save (device block -> slot), load (slot -> device
    block) or zero (scrub a slot that left its domain; `block` is -1); for the disk
    tier, spill (host `slot` -> the file of `record`), fetch (`payload`, read from
    disk and verified -> device `block`) and delete (the file of `record`)."""

    kind: TierOpKind
    block: int
    slot: int
    record: BlockRecord | None = None
    payload: bytes | bytearray | memoryview | None = None


@dataclass
class TierEntry:
    """One block kept in the tier."""

    slot: int
    chunk: Chunk
    domain: str
    last_used: float  # the clock of its last use on the device, or of its last load
    tick: int  # recency among all entries (larger: more recent)


@dataclass
class TierCounters:
    """Monotonic counters of one tier, plus its size."""

    lookups: int = 0  # lookups that went on into this tier after a device miss
    hits: int = 0  # of those, lookups that found at least one block here
    hit_blocks: int = 0  # blocks found here (loaded or not)
    loads: int = 0  # blocks copied back to the device
    write_backs: int = 0  # blocks copied down into this tier
    recomputed_instead: int = 0  # blocks found here but recomputed (cheaper than loading)
    evictions: int = 0  # entries dropped for room
    expirations: int = 0  # entries dropped by their domain's TTL
    refused: int = 0  # write-downs refused (no slot the writer's share allows)
    bad_files: int = 0  # disk tier: files found torn, corrupt or missing on a read
    load_time_s: float = 0.0  # seconds spent bringing blocks up to the device
    store_time_s: float = 0.0  # seconds spent writing blocks down into this tier


@dataclass(frozen=True)
class TierStats:
    """A frozen snapshot of one tier for `EngineStats` and metrics."""

    medium: str
    capacity_blocks: int
    blocks: int
    bytes_per_block: int
    lookups: int
    hits: int
    hit_blocks: int
    loads: int
    write_backs: int
    recomputed_instead: int
    evictions: int
    expirations: int
    # Seconds of transfers (vLLM's kv_offload_{load,store}_time): loads into the device
    # pool from here (a disk tier's file reads included), and writes down into here.
    load_time_s: float = 0.0
    store_time_s: float = 0.0

    @property
    def bytes(self) -> int:
        """Bytes of the blocks held now."""
        return self.blocks * self.bytes_per_block

    @property
    def capacity_bytes(self) -> int:
        """Bytes of the whole tier."""
        return self.capacity_blocks * self.bytes_per_block


class KVTier(Protocol):
    """A place below the device pool where evicted blocks live on under their own key.

    Contract: `match` returns the slots of the longest run of `keys` held with the
    same chunks, and counts the lookup and what it found (nothing else changes);
    `recomputed` counts a matched run the caller recomputes instead; `store` keeps a
    block under its key (False when the writer's share allows no slot); `load` queues
    a copy of a held block into a device block (False if it is gone); `expire` drops
    entries past their domain's TTL. Copies are queued as `TierOp`s for the engine
    (`take_ops`).
    """

    medium: str
    counters: TierCounters

    def match(self, keys: Sequence[bytes], chunks: Sequence[Chunk], now: float) -> list[int]:
        """Slots of the leading `keys` this tier holds, unexpired, with the same token ids."""
        ...

    def recomputed(self, slots: Sequence[int]) -> None:
        """Counts the run `match` returned as recomputed instead of loaded."""
        ...

    def store(self, key: bytes, chunk: Chunk, domain: str, last_used: float, block: int) -> bool:
        """Writes device `block` down under `key` (a no-op when already held)."""
        ...

    def load(self, key: bytes, chunk: Chunk, block: int, now: float) -> bool:
        """Queues a copy of the entry `key` into device `block`; False if not held."""
        ...

    def expire(self, now: float) -> None:
        """Drops entries idle past their domain's retention."""
        ...

    def discard(self, key: bytes) -> None:
        """Forgets `key` in every tier (its load failed: a miss from now on)."""
        ...

    def take_ops(self) -> list[TierOp]:
        """The copies queued since the last call, in order."""
        ...

    def stats(self) -> TierStats:
        """Counters and size now."""
        ...

    def check_integrity(self) -> None:
        """Raises if the tier's bookkeeping is inconsistent."""
        ...

    def tier_stats(self) -> tuple[TierStats, ...]:
        """`stats()` of this tier, then of each tier below it (for `EngineStats.kv_tiers`)."""
        ...

    def record_events(self, events: KVEventLog) -> None:
        """Announces this tier's (and the tiers below's) blocks in `events` from now on,
        each with its tier's medium, starting with those held now."""
        ...


class HostTier:
    """`KVTier` over `num_slots` block-shaped slots in host memory."""

    def __init__(
        self,
        num_slots: int,
        bytes_per_block: int,
        *,
        ttl_of: Callable[[str], float | None] = lambda _d: None,
        scrub_of: Callable[[str], bool] = lambda _d: False,
        medium: str = "CPU_HOST",
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"a host KV tier needs at least one slot, got {num_slots}")
        self.medium = medium
        self.num_slots = num_slots
        self.bytes_per_block = bytes_per_block
        self._ttl_of = ttl_of
        self._scrub_of = scrub_of
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._by_key: dict[bytes, TierEntry] = {}
        # Per domain, keys oldest first (moved to the end on every use).
        self._lru: dict[str, OrderedDict[bytes, None]] = {}
        self._per_tenant: dict[str, int] = {}
        self._ops: list[TierOp] = []
        self._tick = 0
        self._next_scan = float("-inf")
        self.counters = TierCounters()
        # The disk tier (L3) below, if any (`attach_lower`): entries this tier evicts
        # for room are written down there, and a miss here continues there.
        self.lower: DiskTier | None = None
        # The manager's KV event log (`record_events`); None: no events asked for.
        self.events: KVEventLog | None = None
        # Runs queued ops outside a step (`close`); set where the host copies live
        # (host_setup.attach_host_tier). None: nothing can be spilled at close.
        self.executor: Callable[[list[TierOp]], object] | None = None
        self._closed = False

    def record_events(self, events: KVEventLog) -> None:
        """Announces entries stored and dropped here, and in the tier below, in `events`
        (with this tier's medium); the entries held now first (a disk tier's adopted
        blocks, found before the engine asked for events)."""
        self.events = events
        for key, entry in self._by_key.items():
            events.tier_stored(key, entry.chunk, entry.domain, self.medium)
        if self.lower is not None:
            self.lower.record_events(events)

    def close(self, drain_s: float = CLOSE_DRAIN_S) -> None:
        """Engine shutdown: spills what this tier holds to the disk tier below, so that a
        restarted engine finds it, then lets the disk tier finish its writes and stop.

        Bounded: the disk tier takes only what its budget and the tenants' shares allow
        (as for any spill), and the writes wait `drain_s` at most; what is left is
        dropped. The ops the last step left are run first, in order: a write-back
        queued then is what fills the slot a spill copies. A second call does nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self.lower is None:
            return
        deadline = time.monotonic() + drain_s
        try:
            if self.executor is not None and not self.lower.store_failed():
                self.executor(self.take_ops())
                self.lower.files.drain_until(deadline)
                self.spill_all()
                self.executor(self.take_ops())
        finally:
            # Whatever happened above, the writer stops and the directory's lock goes.
            self.lower.files.close(max(0.0, deadline - time.monotonic()))

    def spill_all(self) -> int:
        """Queues a spill to the disk tier of every unexpired entry it lacks, least
        recently used first (so the newest end up newest there too); returns how many
        it took. The entries stay here."""
        lower = self.lower
        if lower is None:
            return 0
        now = lower._clock()
        taken = 0
        for key, entry in sorted(self._by_key.items(), key=lambda item: item[1].tick):
            if self._expired(entry, now) or key in lower._by_key:
                continue
            if lower.store(key, entry.chunk, entry.domain, entry.last_used, entry.slot):
                taken += 1
        return taken

    def attach_lower(self, lower: DiskTier) -> None:
        """Puts `lower` under this tier. Both queue their ops in this tier's one list,
        so that a spill of a slot always runs before a later op reuses that slot."""
        self.lower = lower
        lower._ops = self._ops
        if self.events is not None:
            lower.record_events(self.events)

    def __len__(self) -> int:
        return len(self._by_key)

    # -- lookup and load -----------------------------------------------------------

    def match(self, keys: Sequence[bytes], chunks: Sequence[Chunk], now: float) -> list[int]:
        """Slots of the leading blocks held here, compared by token ids too; an entry past
        its domain's TTL is a miss even before a scan frees it. Counts the lookup, and
        the blocks found in host memory only."""
        self.counters.lookups += 1
        slots = self._held_run(keys, chunks, now)
        n = len(slots)
        if n:
            self.counters.hits += 1
            self.counters.hit_blocks += n
        if self.lower is not None and n < len(keys):
            # The same chain goes on in the disk tier: its verified blocks follow, with
            # no host slot (-1: `load` fetches them to the device from their payloads).
            # The disk tier counts that lookup and its hits itself.
            slots.extend([-1] * len(self.lower.match(keys[n:], chunks[n:], now)))
        return slots

    def _held_run(self, keys: Sequence[bytes], chunks: Sequence[Chunk], now: float) -> list[int]:
        """Slots of the leading `keys` held here, unexpired, with the same chunks (no count)."""
        slots: list[int] = []
        for key, chunk in zip(keys, chunks, strict=True):
            entry = self._by_key.get(key)
            if entry is None or entry.chunk != chunk or self._expired(entry, now):
                break
            slots.append(entry.slot)
        return slots

    def recomputed(self, slots: Sequence[int]) -> None:
        """The caller recomputes the run `match` returned: each tier counts its own blocks
        (host slots here, the disk tier's -1 entries there)."""
        own = sum(1 for s in slots if s >= 0)
        self.counters.recomputed_instead += own
        if self.lower is not None and len(slots) > own:
            self.lower.counters.recomputed_instead += len(slots) - own

    def discard(self, key: bytes) -> None:
        """Forgets `key` here and in the tier below (a load of it failed: what it holds
        is not trusted again, so the next lookup misses and recomputes)."""
        if key in self._by_key:
            self._drop(key)
        if self.lower is not None:
            self.lower.discard(key)

    def _expired(self, entry: TierEntry, now: float) -> bool:
        ttl = self._ttl_of(entry.domain)
        return ttl is not None and entry.last_used + ttl <= now

    def load(self, key: bytes, chunk: Chunk, block: int, now: float) -> bool:
        """Queues slot -> `block`; the entry stays (the tier is inclusive), now the newest."""
        entry = self._by_key.get(key)
        if entry is None or entry.chunk != chunk or self._expired(entry, now):
            return self._promote(key, chunk, block, now)
        self._ops.append(TierOp("load", block, entry.slot))
        self._touch(key, entry, now)
        self.counters.loads += 1
        return True

    def _promote(self, key: bytes, chunk: Chunk, block: int, now: float) -> bool:
        """Loads a block the disk tier matched: its payload, read and verified into host
        memory at the match, is copied to device `block` (a fetch). It takes no host
        slot: were it to, a promotion could be refused by the host tier's shares, or
        push other tenants' entries down; when the device evicts it later, it comes
        down through this tier like any block (the disk tier still holds it)."""
        if self.lower is None:
            return False
        staged = self.lower.take_staged(key, chunk)
        if staged is None:
            return False
        self._ops.append(TierOp("fetch", block, -1, payload=staged[1]))
        self.lower.promoted(key, now)
        return True

    def _touch(self, key: bytes, entry: TierEntry, now: float) -> None:
        self._tick += 1
        entry.tick = self._tick
        entry.last_used = max(entry.last_used, now)
        self._lru[entry.domain].move_to_end(key)

    # -- write-down ----------------------------------------------------------------

    def store(self, key: bytes, chunk: Chunk, domain: str, last_used: float, block: int) -> bool:
        """Writes `block` down under `key`, displacing an entry as the shares allow."""
        entry = self._by_key.get(key)
        if entry is not None:
            # The same key holds the same tokens under the same root: same KV, no copy.
            self._touch(key, entry, last_used)
            return True
        if not self._free and not self._make_room(tenant_root(domain)):
            self.counters.refused += 1
            return False
        slot = self._free.pop()
        self._tick += 1
        entry = self._by_key[key] = TierEntry(slot, chunk, domain, last_used, self._tick)
        self._lru.setdefault(domain, OrderedDict())[key] = None
        root = tenant_root(domain)
        self._per_tenant[root] = self._per_tenant.get(root, 0) + 1
        self._queue_write(key, entry, block)
        self.counters.write_backs += 1
        if self.events is not None:
            self.events.tier_stored(key, chunk, domain, self.medium)
        return True

    def _queue_write(self, key: bytes, entry: TierEntry, source: int) -> None:
        """Queues the copy of a new entry from `source` (here a device block)."""
        self._ops.append(TierOp("save", source, entry.slot))

    def fair_share(self, writer_root: str) -> int:
        """Slots each tenant may hold against the others: the tier over the tenants
        holding entries (the writer counted among them)."""
        tenants = set(self._per_tenant) | {writer_root}
        return max(1, self.num_slots // len(tenants))

    def _make_room(self, writer_root: str) -> bool:
        share = self.fair_share(writer_root)
        if self._per_tenant.get(writer_root, 0) >= share:
            victim_root = writer_root
        else:
            over = [
                (n - share, root)
                for root, n in self._per_tenant.items()
                if root != writer_root and n > share
            ]
            if not over:
                return False
            victim_root = max(over)[1]
        victim = self._lru_of_tenant(victim_root)
        if victim is None:
            return False
        self._drop(victim, spill=True)
        self.counters.evictions += 1
        return True

    def _lru_of_tenant(self, root: str) -> bytes | None:
        best: tuple[int, bytes] | None = None
        for domain, keys in self._lru.items():
            if not keys or tenant_root(domain) != root:
                continue
            key = next(iter(keys))
            tick = self._by_key[key].tick
            if best is None or tick < best[0]:
                best = (tick, key)
        return None if best is None else best[1]

    def _drop(self, key: bytes, *, spill: bool = False) -> None:
        """Forgets an entry; its slot is zeroed first where its domain scrubs. `spill`
        (evicted for room, not expired) writes it down to the tier below first."""
        entry = self._by_key.pop(key)
        if spill and self.lower is not None:
            # Queued before the zero op and before the save that reuses the slot.
            self.lower.store(key, entry.chunk, entry.domain, entry.last_used, entry.slot)
        keys = self._lru[entry.domain]
        del keys[key]
        if not keys:
            del self._lru[entry.domain]
        root = tenant_root(entry.domain)
        self._per_tenant[root] -= 1
        if not self._per_tenant[root]:
            del self._per_tenant[root]
        self._queue_drop(key, entry)
        self._free.append(entry.slot)
        if self.events is not None:
            self.events.tier_removed(key, self.medium)

    def _queue_drop(self, key: bytes, entry: TierEntry) -> None:
        """Queues what a dropped entry's bytes need: a zeroed slot where its domain scrubs."""
        if self._scrub_of(entry.domain):
            self._ops.append(TierOp("zero", -1, entry.slot))

    # -- retention -----------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Drops entries idle for longer than their domain's TTL (a full scan, at most
        once every `EXPIRY_SCAN_S`: lookups call this, and `match` already refuses
        expired entries)."""
        if self.lower is not None:
            self.lower.expire(now)
        if now < self._next_scan:
            return
        self._next_scan = now + EXPIRY_SCAN_S
        for domain in list(self._lru):
            ttl = self._ttl_of(domain)
            if ttl is None:
                continue
            # Write-downs carry their device age, so the order is only roughly by age.
            old = [k for k in self._lru[domain] if self._by_key[k].last_used + ttl <= now]
            for key in old:
                self._drop(key)
                self.counters.expirations += 1

    # -- for the engine ------------------------------------------------------------

    def take_ops(self) -> list[TierOp]:
        """The copies queued since the last call, in the order they must run."""
        # Cleared in place: a disk tier below queues into this same list.
        ops = list(self._ops)
        self._ops.clear()
        return ops

    def domain_blocks(self) -> dict[str, int]:
        """Entries per domain (for tests and the console)."""
        return {d: len(keys) for d, keys in self._lru.items()}

    def stats(self) -> TierStats:
        """Counters and size now."""
        c = self.counters
        return TierStats(
            medium=self.medium,
            capacity_blocks=self.num_slots,
            blocks=len(self._by_key),
            bytes_per_block=self.bytes_per_block,
            lookups=c.lookups,
            hits=c.hits,
            hit_blocks=c.hit_blocks,
            loads=c.loads,
            write_backs=c.write_backs,
            recomputed_instead=c.recomputed_instead,
            evictions=c.evictions,
            expirations=c.expirations,
            load_time_s=c.load_time_s,
            store_time_s=c.store_time_s,
        )

    def tier_stats(self) -> tuple[TierStats, ...]:
        """This tier's stats, then the disk tier's if there is one."""
        return (self.stats(),) + (() if self.lower is None else self.lower.tier_stats())

    def check_integrity(self) -> None:
        """Every slot is free or held once; the LRU lists and tenant counts add up."""
        held = [e.slot for e in self._by_key.values()]
        if len(set(held)) != len(held) or set(held) & set(self._free):
            raise AssertionError("a host tier slot is held twice, or held and free")
        if len(held) + len(self._free) != self.num_slots or len(set(self._free)) != len(self._free):
            raise AssertionError("host tier slots are lost or duplicated")
        listed = {k: d for d, keys in self._lru.items() for k in keys}
        if listed.keys() != self._by_key.keys() or any(
            self._by_key[k].domain != d for k, d in listed.items()
        ):
            raise AssertionError("host tier LRU lists disagree with its entries")
        tenants: dict[str, int] = {}
        for e in self._by_key.values():
            root = tenant_root(e.domain)
            tenants[root] = tenants.get(root, 0) + 1
        if tenants != self._per_tenant:
            raise AssertionError("host tier tenant counts are off")
        if self.lower is not None:
            self.lower.check_integrity()
