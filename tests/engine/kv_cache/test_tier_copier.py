"""The tier copier's order rules and the failed-load bookkeeping, without a model.

Host slots and device blocks are small CPU tensors filled with marker values, so a
test reads which bytes a copy moved.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.kv_cache.block_meta import BlockMeta
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.host_buffer import HostKVBuffer
from engine.kv_cache.host_tier import HostTier, TierOp
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.tier_copier import TierCopier
from engine.kv_cache.tier_cost import LoadCostRule
from engine.kv_cache.tier_loads import doomed

OLD, NEW = 7.0, 9.0  # what slot 0 holds at first, and what block 2 writes down into it


def setup() -> tuple[TierCopier, HostKVBuffer, list[str]]:
    """A copier over one layer of 4 device blocks and 2 host slots; `order` records
    when loads (on the worker) and the step's own copies run."""
    device = [torch.zeros(2, 4, 2, 1, 2)]
    buffer = HostKVBuffer(device, num_slots=2)
    buffer.slots[0][:, 0] = OLD
    device[0][:, 2] = NEW
    tier = HostTier(2, buffer.bytes_per_block)
    kv = KVCacheManager(BlockPool(4), 2)
    order: list[str] = []
    run_sync = buffer.execute

    def sync(ops: Sequence[TierOp], cost: LoadCostRule | None = None) -> dict[str, float]:
        order.extend(op.kind for op in ops)
        return run_sync(ops, cost)

    def loads(ops: list[TierOp]) -> dict[str, float]:
        order.extend(op.kind for op in ops)
        return run_sync(ops)

    buffer.execute = sync  # type: ignore[method-assign]
    copier = TierCopier(buffer, tier, kv, None, copy=loads)
    return copier, buffer, order


def test_a_write_back_into_a_slot_waits_for_the_load_reading_it() -> None:
    copier, buffer, order = setup()
    # Issued in this order: the load must read slot 0 before the save overwrites it.
    copier.run([TierOp("load", 1, 0), TierOp("save", 2, 0)])
    copier.drain()
    assert order == ["load", "save"]
    assert bool((buffer.device_caches[0][:, 1] == OLD).all())
    assert bool((buffer.slots[0][:, 0] == NEW).all())
    assert copier.busy  # finished, not joined yet


def test_a_load_issued_after_a_write_back_reads_what_it_wrote() -> None:
    copier, buffer, order = setup()
    copier.run([TierOp("save", 2, 0), TierOp("load", 1, 0)])
    copier.drain()
    assert order == ["save", "load"]
    assert bool((buffer.device_caches[0][:, 1] == NEW).all())


def test_loads_go_to_the_worker_and_the_rest_runs_in_the_step() -> None:
    copier, buffer, order = setup()
    copier.run([TierOp("load", 1, 0), TierOp("save", 2, 1), TierOp("zero", -1, 1)])
    # The step's copies ran before run() returned; the load only once submitted.
    assert order[:2] == ["save", "zero"]
    copier.drain()
    assert order == ["save", "zero", "load"]
    assert bool((buffer.slots[0][:, 1] == 0).all())


def test_a_failed_load_dooms_the_chain_under_it() -> None:
    meta = {
        1: BlockMeta("t:a", None),
        2: BlockMeta("t:a", 1),
        3: BlockMeta("t:a", 2),
        5: BlockMeta("t:a", 2),
        4: BlockMeta("t:b", None),
        6: BlockMeta("t:a", 1),
    }
    assert doomed([2], meta) == {2, 3, 5}
    assert doomed([1], meta) == {1, 2, 3, 5, 6}
    assert doomed([], meta) == set()
    assert doomed([9], meta) == set()  # no longer registered: nothing to drop
