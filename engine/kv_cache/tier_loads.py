"""Device blocks a lower tier is still filling, for the manager (issue 41, item 3).

A block loaded from the host or disk tier is registered in the device index at the
lookup, so that a second lookup of the same chain finds it, but its bytes arrive
later, off the step's path (engine/kv_cache/tier_copier.py). Until they are in:

- the load holds the block (one reference of its own), so nothing evicts it, writes
  it down, scrubs it or hands it to another sequence while the copy writes it;
- a sequence whose block table holds it is not ready: it keeps its blocks and sits
  the steps out (`KVCacheManager.ready`), while the rest of the batch runs. That
  covers a second sequence of the same domain that adopted the block as a device
  hit, and a running sequence whose computed block was swapped for it.

A load that fails leaves its blocks, and the cached blocks chained under them (whose
prefix they are), to be dropped (`doomed`): the sequences over them are recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine.kv_cache.block_meta import BlockMeta


class LoadingBlocks:
    """The device blocks whose loads have been queued and not yet joined."""

    def __init__(self) -> None:
        self._blocks: set[int] = set()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def begin(self, block: int) -> None:
        """A load into `block` was queued."""
        self._blocks.add(block)

    def any_in(self, block_ids: Iterable[int]) -> bool:
        """Whether a block table holds a block still being loaded."""
        return bool(self._blocks) and not self._blocks.isdisjoint(block_ids)

    def finish(self, blocks: Iterable[int]) -> list[int]:
        """Ends the loads of `blocks`; returns those that were loading (each once)."""
        ended: list[int] = []
        for b in blocks:
            if b in self._blocks:
                self._blocks.remove(b)
                ended.append(b)
        return ended


def doomed(failed: Iterable[int], meta: Mapping[int, BlockMeta]) -> set[int]:
    """The failed blocks and every cached block chained under one of them: their
    keys promise a prefix whose bytes were never written. Rare (a failed load), so a
    walk over the cached blocks' parents does."""
    bad = {b for b in failed if b in meta}
    if not bad:
        return bad
    verdict: dict[int, bool] = {b: True for b in bad}
    for block in meta:
        path: list[int] = []
        b: int | None = block
        while b is not None and b not in verdict:
            path.append(b)
            b = meta[b].parent if b in meta else None
        hit = b is not None and verdict[b]
        for p in path:
            verdict[p] = hit
    return {b for b, v in verdict.items() if v}
