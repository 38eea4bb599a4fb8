"""Random multi-tenant traffic through the real scheduler and cache, with a host tier
and a disk tier under it whose files are real (a `DiskStore` in a temporary folder).

As in test_host_tier_fuzz.py, fake blocks carry their tokens and the identity
(domain, adapter, ...) they were computed under; here a spilled block's payload is
that pair, written to a file and read back through the digest check. Every adopted
block, from whichever tier, must hold its sequence's tokens under its own domain;
the bookkeeping must stay consistent after every step; and once the writer is done,
the folder holds exactly one file per disk entry.
"""

from __future__ import annotations

import json
import pathlib
import random

import pytest

from engine.kv_cache.disk_format import model_fingerprint
from engine.kv_cache.disk_store import DiskStore
from engine.kv_cache.disk_tier import DiskTier
from engine.kv_cache.eviction import CachePolicy
from engine.kv_cache.host_tier import HostTier
from tests.engine.prefix_cache.cache_driver import CacheDriver, Identity
from tests.engine.prefix_cache.test_host_tier_fuzz import (
    TieredDriver,
    add_random_prompts,
    shared_openings,
)

PAYLOAD = 512


def encode(tokens: list[int], ident: Identity | None) -> bytes:
    raw = json.dumps([tokens, ident]).encode()
    assert len(raw) <= PAYLOAD
    return raw.ljust(PAYLOAD, b" ")


def decode(payload: bytes) -> tuple[list[int], Identity | None]:
    tokens, ident = json.loads(bytes(payload).decode())
    return tokens, None if ident is None else (ident[0], ident[1], tuple(ident[2]), tuple(ident[3]))


class DiskTieredDriver(TieredDriver):
    """Runs the disk ops too: spill (host slot -> file), fetch (payload -> block), delete."""

    def __init__(self, driver: CacheDriver, tier: HostTier, store: DiskStore) -> None:
        super().__init__(driver, tier)
        self.store = store
        self.fetches = 0

    def run_ops(self) -> None:
        for op in self.tier.take_ops():
            if op.kind == "spill":
                assert op.record is not None
                tokens, ident = self.host[op.slot]
                assert ident is not None and ident[0] == op.record.domain
                self.store.write(op.record, encode(tokens, ident))
            elif op.kind == "delete":
                assert op.record is not None
                self.store.delete(op.record.key)
            elif op.kind == "fetch":
                assert op.payload is not None
                tokens, ident = decode(bytes(op.payload))
                assert ident is not None
                self.d.store[op.block] = list(tokens)
                self.d.identity[op.block] = ident
                self.fetches += 1
            else:
                self.run_host_op(op)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_with_a_disk_tier_keeps_isolation(seed: int, tmp_path: pathlib.Path) -> None:
    rng = random.Random(seed)
    policy = CachePolicy(fair_cached_share=0.2, scrub_freed_blocks=seed == 1)
    driver = CacheDriver.make("hash", num_blocks=24, block_size=4, policy=policy)
    driver.check_hits = False  # the driver's model knows the device pool only
    kv = driver.kv
    host = HostTier(4 + 2 * seed, 1, ttl_of=kv.ledger.ttl, scrub_of=kv.ledger.scrub)
    store = DiskStore(tmp_path, model_fingerprint("rev", (seed,)), PAYLOAD)
    disk = DiskTier(
        10 + 6 * seed,
        PAYLOAD,
        store,
        ttl_of=kv.ledger.ttl,
        scrub_of=kv.ledger.scrub,
        clock=lambda: kv.clock(),
    )
    host.attach_lower(disk)
    kv.attach_tier(host)
    tiered = DiskTieredDriver(driver, host, store)
    openings = shared_openings(rng)
    for _round in range(8):
        add_random_prompts(driver, rng, openings)
        tiered.run()
        store.flush()  # also lets a lookup read files rather than queued bytes
    driver.assert_clean()
    stats = disk.stats()
    assert stats.write_backs > 0 and stats.loads > 0 and tiered.fetches == stats.loads
    store.flush()
    on_disk = {p.name for p in tmp_path.iterdir() if p.name.endswith(".kvb")}
    assert on_disk == {k.hex() + ".kvb" for k in disk._by_key}
    assert len(on_disk) <= disk.num_slots
    # A second store over the folder (a restart) finds the same entries again.
    again = DiskTier(disk.num_slots, PAYLOAD, DiskStore(tmp_path, store.fingerprint, PAYLOAD))
    assert again.adopt(again.files.scan()) == len(disk)
    assert again.domain_blocks() == disk.domain_blocks()
    # A restart with a smaller budget keeps what fits and deletes the rest.
    small = DiskTier(3, PAYLOAD, DiskStore(tmp_path, store.fingerprint, PAYLOAD))
    assert small.adopt(small.files.scan()) == 3
    small.check_integrity()
    small.files.flush()
    assert len([p for p in tmp_path.iterdir() if p.name.endswith(".kvb")]) == 3
