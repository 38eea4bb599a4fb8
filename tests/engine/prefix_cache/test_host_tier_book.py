"""The host tier's bookkeeping alone: shares under a flood, TTL, scrub ops, integrity."""

from __future__ import annotations

import pytest

from engine.kv_cache.host_buffer import _runs
from engine.kv_cache.host_tier import HostTier, TierOp


def key(domain: str, i: int) -> bytes:
    return f"{domain}/{i}".encode()


def chunk(i: int) -> tuple[int, ...]:
    return (i, i + 1)


def test_a_flooding_tenant_cannot_flush_the_others() -> None:
    tier = HostTier(8, 64)
    for i in range(4):
        assert tier.store(key("t:a", i), chunk(i), "t:a", 0.0, block=i)
    for i in range(100):  # t:b writes down far more than the tier holds
        assert tier.store(key("t:b", i), chunk(i), "t:b", float(i), block=i)
    assert tier.domain_blocks() == {"t:a": 4, "t:b": 4}
    keys_a, chunks_a = [key("t:a", i) for i in range(4)], [chunk(i) for i in range(4)]
    assert len(tier.match(keys_a, chunks_a, 0.0)) == 4
    # A third tenant under its share takes room from the tenants over it.
    tier.store(key("t:c", 0), chunk(0), "t:c", 0.0, block=0)
    assert tier.domain_blocks()["t:c"] == 1
    assert sum(tier.domain_blocks().values()) == 8
    tier.check_integrity()


def test_a_tenants_many_domains_share_one_part() -> None:
    tier = HostTier(8, 64)
    for i in range(4):
        tier.store(key("t:a", i), chunk(i), "t:a", 0.0, block=i)
    for i in range(40):  # many keys of tenant b: still one tenant's share
        tier.store(key(f"t:b/k:{i}", 0), chunk(0), f"t:b/k:{i}", float(i), block=i)
    assert tier.domain_blocks()["t:a"] == 4
    tier.check_integrity()


def test_match_compares_token_ids_and_stops_at_the_first_miss() -> None:
    tier = HostTier(4, 64)
    tier.store(b"k0", (1, 2), "t:a", 0.0, block=0)
    tier.store(b"k1", (3, 4), "t:a", 0.0, block=1)
    assert len(tier.match([b"k0", b"k1"], [(1, 2), (3, 4)], 0.0)) == 2
    assert tier.match([b"k0", b"k1"], [(1, 2), (9, 9)], 0.0) == [
        tier.match([b"k0"], [(1, 2)], 0.0)[0]
    ]
    assert tier.match([b"k0"], [(1, 3)], 0.0) == []  # a colliding key with other tokens
    assert not tier.load(b"k0", (1, 3), block=5, now=0.0)


def test_ttl_and_scrub_queue_zero_ops_for_dropped_slots() -> None:
    tier = HostTier(4, 64, ttl_of=lambda d: 10.0 if d == "t:a" else None, scrub_of=lambda d: True)
    tier.store(b"a", (1,), "t:a", 0.0, block=3)
    tier.store(b"b", (1,), "t:b", 0.0, block=4)
    ops = tier.take_ops()
    assert [o.kind for o in ops] == ["save", "save"]
    slot_a = ops[0].slot
    tier.expire(5.0)
    assert tier.take_ops() == [] and len(tier) == 2
    # Past its TTL an entry is a miss at once, before any scan frees its slot.
    assert tier.match([b"a"], [(1,)], 9.5) != [] and tier.match([b"a"], [(1,)], 10.0) == []
    assert not tier.load(b"a", (1,), block=0, now=10.0)
    tier.expire(5.5)  # within the scan period: nothing is scanned
    assert len(tier) == 2
    tier.expire(10.0)
    assert tier.take_ops() == [TierOp("zero", -1, slot_a)]
    assert tier.domain_blocks() == {"t:b": 1} and tier.stats().expirations == 1
    tier.check_integrity()


def test_store_of_a_held_key_copies_nothing() -> None:
    tier = HostTier(4, 64)
    tier.store(b"a", (1,), "t:a", 0.0, block=3)
    tier.take_ops()
    assert tier.store(b"a", (1,), "t:a", 1.0, block=7)
    assert tier.take_ops() == [] and tier.stats().write_backs == 1


def test_integrity_catches_a_lost_slot() -> None:
    tier = HostTier(4, 64)
    tier.store(b"a", (1,), "t:a", 0.0, block=3)
    tier.check_integrity()
    tier._free.append(tier._by_key[b"a"].slot)  # held and free at once
    with pytest.raises(AssertionError):
        tier.check_integrity()


def test_copy_runs_never_reorder_two_writes_to_one_place() -> None:
    ops = [TierOp("save", 1, 0), TierOp("save", 2, 1), TierOp("save", 3, 0), TierOp("load", 5, 1)]
    runs = _runs(ops)
    assert [k for k, _ in runs] == ["save", "save", "load"]
    assert runs[0][1] == [(1, 0), (2, 1)] and runs[1][1] == [(3, 0)]
