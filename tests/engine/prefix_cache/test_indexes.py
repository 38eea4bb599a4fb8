"""The two PrefixIndex implementations directly: matching, splits, locks, lookup work."""

from __future__ import annotations

import pytest

from engine.kv_cache.cache_key import CacheKey
from engine.kv_cache.index_factory import make_prefix_index
from engine.kv_cache.prefix_index import PrefixIndex, PrefixIndexError
from engine.kv_cache.radix_index import RadixIndex
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.kv_inspect import num_nodes

BS = 4
ROOT_A = CacheKey.derive("a", None, "r").digest
ROOT_B = CacheKey.derive("b", None, "r").digest


def index(mode: str) -> PrefixIndex:
    made = make_prefix_index(mode, BS)
    assert made is not None
    return made


@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_insert_match_and_divergence(mode: str) -> None:
    ix = index(mode)
    assert ix.insert(ROOT_A, None, list(range(12)), [10, 11, 12]) == [10, 11, 12]
    # Diverges in the third block: shares two, registers one new.
    assert ix.insert(ROOT_A, 11, [9, 9, 9, 9], [20]) == [20]
    assert ix.match(ROOT_A, list(range(8)) + [9, 9, 9, 9], 9).block_ids == [10, 11, 20]
    assert ix.match(ROOT_A, list(range(12)), 2).block_ids == [10, 11]
    assert ix.match(ROOT_B, list(range(12)), 3).block_ids == []
    # Re-inserting known blocks returns the registered ids (dedupe).
    assert ix.insert(ROOT_A, None, list(range(8)), [30, 31]) == [10, 11]
    ix.remove(12)
    with pytest.raises(PrefixIndexError):
        ix.remove(11)  # still has a child
    ix.check_integrity()
    assert len(ix) == 3


def test_radix_splits_on_lock_and_protects_locked_paths() -> None:
    ix = RadixIndex(BS)
    ix.insert(ROOT_A, None, list(range(12)), [1, 2, 3])
    assert num_nodes(ix) == 1
    ix.lock(2)  # the path must end at block 2: the edge splits
    assert num_nodes(ix) == 2
    ix.remove(3)
    with pytest.raises(PrefixIndexError):
        ix.remove(2)  # locked
    ix.unlock(2)
    ix.remove(2)
    ix.remove(1)
    assert len(ix) == 0
    ix.check_integrity()


@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_lookup_work_does_not_grow_with_other_domains(mode: str) -> None:
    def probe_work(other_prompts: int) -> int:
        d = CacheDriver.make(mode, num_blocks=2048)
        d.add(list(range(1, 30)), 1, "a")
        for i in range(other_prompts):
            d.add([7, 7, 7, 7] + [1000 + 40 * i + k for k in range(25)], 1, f"o{i % 5}")
        d.run()
        before = d.kv.lookup_work
        d.add(list(range(1, 30)) + [5], 1, "a")
        d.run()
        return d.kv.lookup_work - before

    base = probe_work(0)
    assert base > 0
    assert probe_work(50) == base
    assert probe_work(200) == base
