"""The fixed pool of KV blocks: pure bookkeeping (ids and reference counts), no tensors.

The tensors themselves are allocated once by the model runner; a block id here
indexes dimension 1 of every layer's cache tensor.
"""

from __future__ import annotations

from collections import deque

from engine.errors import EngineError


class BlockPoolError(EngineError):
    """A bookkeeping invariant was broken (double free, allocation past capacity)."""


class BlockPool:
    """Hands out block ids and counts their references.

    A block is free exactly when its reference count is 0. A block shared by two
    sequences has a count of 2 and returns to the free list only when both let go.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks that nobody references."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return 1.0 - self.num_free / self.num_blocks

    def can_allocate(self, n: int) -> bool:
        """True when `n` blocks can be allocated now."""
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Takes `n` free blocks, each with a reference count of 1."""
        if n > len(self._free):
            raise BlockPoolError(f"asked for {n} blocks with only {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(n)]
        for block_id in ids:
            self._ref_counts[block_id] = 1
        return ids

    def incref(self, block_ids: list[int]) -> None:
        """Adds a reference to blocks that are already in use (sharing)."""
        for block_id in block_ids:
            if self._ref_counts[block_id] <= 0:
                raise BlockPoolError(f"incref of free block {block_id}")
            self._ref_counts[block_id] += 1

    def free(self, block_ids: list[int]) -> list[int]:
        """Drops one reference from each block; returns the ids that became free.

        Freed in reverse so that a sequence's tail blocks are reused first and its
        head blocks, the likeliest to be shared, stay untouched longest.
        """
        released: list[int] = []
        for block_id in reversed(block_ids):
            count = self._ref_counts[block_id]
            if count <= 0:
                raise BlockPoolError(f"double free of block {block_id}")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free.append(block_id)
                released.append(block_id)
        return released

    def ref_count(self, block_id: int) -> int:
        """Current number of references to a block."""
        return self._ref_counts[block_id]

    def check_integrity(self) -> None:
        """Asserts that the free list is exactly the set of unreferenced blocks."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise BlockPoolError("a block appears twice in the free list")
        unreferenced = {i for i, c in enumerate(self._ref_counts) if c == 0}
        if free != unreferenced:
            raise BlockPoolError(
                f"free list and reference counts disagree: {sorted(free ^ unreferenced)[:8]}"
            )
        if any(c < 0 for c in self._ref_counts):
            raise BlockPoolError("negative reference count")
