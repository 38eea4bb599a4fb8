"""The bytes of the host KV tier: block-shaped slots in host memory, and the copies.

One tensor per layer shaped like the device cache's but with `num_slots` in place of
the pool's blocks: (2, num_slots, block_size, kv_heads, head_dim). Pinned on CUDA, so
that copies both ways can run asynchronously on the current stream; in process
memory on the CPU, where this is simply a second pool.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from engine.kv_cache.disk_store import DiskStore
from engine.kv_cache.host_tier import TierOp
from engine.kv_cache.tier_cost import LoadCostRule

# Ops that touch the disk tier's files: each runs alone, in its place in the order.
_DISK_OPS = ("spill", "fetch", "delete")


class HostKVBuffer:
    """Host slots for `num_slots` blocks of every layer, and the executor of `TierOp`s."""

    def __init__(self, device_caches: Sequence[torch.Tensor], num_slots: int) -> None:
        if not device_caches:
            raise ValueError("a host KV buffer needs the device cache tensors")
        first = device_caches[0]
        shape = (first.shape[0], num_slots, *first.shape[2:])
        self.device = first.device
        self.pinned = first.device.type == "cuda"
        self.num_slots = num_slots
        self.device_caches = list(device_caches)
        self.slots = [
            torch.zeros(shape, dtype=first.dtype, device="cpu", pin_memory=self.pinned)
            for _ in device_caches
        ]
        per_layer = first[:, 0].numel() * first.element_size()
        self.bytes_per_layer = per_layer
        self.bytes_per_block = per_layer * len(device_caches)
        # The disk tier's files (`host_setup.attach_disk_tier`); None: no disk tier.
        self.disk: DiskStore | None = None

    @torch.inference_mode()
    def execute(self, ops: Sequence[TierOp], cost: LoadCostRule | None = None) -> dict[str, float]:
        """Runs the ops in order; the copies' measured bandwidth goes to `cost`. Returns
        the seconds spent per op kind (for the tiers' transfer times).

        Consecutive ops of one kind are batched into one indexed copy per layer (their
        order within such a run does not matter: a run never names a slot or block twice
        in a way that depends on order, see `_runs`).
        """
        times: dict[str, float] = {}
        if not ops:
            return times
        started = time.perf_counter()
        moved = 0
        for kind, run in _op_runs(ops):
            t0 = time.perf_counter()
            if kind in _DISK_OPS:
                # Not host copy bandwidth: the disk tier measures its own reads.
                self._disk_op(run[0])
                spent = time.perf_counter() - t0
                started += spent
                times[kind] = times.get(kind, 0.0) + spent
                continue
            pairs = [(op.block, op.slot) for op in run]
            if kind == "zero":
                if self.pinned:
                    # An asynchronous write-back into this slot may still be in flight.
                    torch.cuda.current_stream(self.device).synchronize()
                idx = torch.tensor([s for _, s in pairs], dtype=torch.long)
                for host in self.slots:
                    host.index_fill_(1, idx, 0)
                times[kind] = times.get(kind, 0.0) + time.perf_counter() - t0
                continue
            blocks = torch.tensor([b for b, _ in pairs], dtype=torch.long, device=self.device)
            slots = torch.tensor([s for _, s in pairs], dtype=torch.long)
            for dev, host in zip(self.device_caches, self.slots, strict=True):
                if kind == "save":
                    host.index_copy_(1, slots, dev.index_select(1, blocks).to("cpu"))
                else:
                    picked = host.index_select(1, slots)
                    if self.pinned:
                        picked = picked.pin_memory()
                    dev.index_copy_(1, blocks, picked.to(self.device, non_blocking=self.pinned))
            moved += len(pairs) * self.bytes_per_block
            times[kind] = times.get(kind, 0.0) + time.perf_counter() - t0
        if cost is not None and moved:
            if self.pinned:
                torch.cuda.current_stream(self.device).synchronize()  # measure real copies
            cost.observe_copy(moved, time.perf_counter() - started)
        return times

    def _disk_op(self, op: TierOp) -> None:
        """Runs one disk tier op: a spill hands a copy of the slot's bytes to the writer
        thread (the step never waits for the file), a fetch fills a device block from a
        payload the tier already read and verified, a delete queues the file's removal."""
        if self.disk is None:
            return
        if op.kind == "delete":
            assert op.record is not None
            self.disk.delete(op.record.key)
        elif op.kind == "spill":
            assert op.record is not None
            if self.pinned:
                torch.cuda.current_stream(self.device).synchronize()
            parts = [
                host[:, op.slot].contiguous().view(torch.uint8).numpy().tobytes()
                for host in self.slots
            ]
            self.disk.write(op.record, b"".join(parts))
        else:
            assert op.payload is not None and len(op.payload) == self.bytes_per_block
            raw = torch.frombuffer(op.payload, dtype=torch.uint8)
            n = self.bytes_per_layer
            for i, dev in enumerate(self.device_caches):
                dst = dev[:, op.block]
                src = raw[i * n : (i + 1) * n].view(dev.dtype).view(dst.shape)
                dst.copy_(src.to(self.device))

    def probe_bandwidth(self, cost: LoadCostRule, repeats: int = 3) -> None:
        """Measures a copy of one block down and back (slot 0, block 0), before any
        request runs, so that the cost rule has a bandwidth from the first lookup."""
        for _ in range(repeats):
            self.execute([TierOp("save", 0, 0), TierOp("load", 0, 0)], cost)
        self.execute([TierOp("zero", -1, 0)])


def _runs(ops: Sequence[TierOp]) -> list[tuple[str, list[tuple[int, int]]]]:
    """`_op_runs` as (block, slot) pairs."""
    return [(kind, [(op.block, op.slot) for op in run]) for kind, run in _op_runs(ops)]


def _op_runs(ops: Sequence[TierOp]) -> list[tuple[str, list[TierOp]]]:
    """Splits ops into runs of one kind that can each run as one batched copy.

    A run ends where an op touches a slot or block the run already touched, so a
    batched copy never has to order two writes to one place; a disk op is a run alone.
    """
    runs: list[tuple[str, list[TierOp]]] = []
    seen_slots: set[int] = set()
    seen_blocks: set[int] = set()
    for op in ops:
        clash = op.slot in seen_slots or (op.block >= 0 and op.block in seen_blocks)
        if not runs or runs[-1][0] != op.kind or clash or op.kind in _DISK_OPS:
            runs.append((op.kind, []))
            seen_slots, seen_blocks = set(), set()
        runs[-1][1].append(op)
        seen_slots.add(op.slot)
        if op.block >= 0:
            seen_blocks.add(op.block)
    return runs
