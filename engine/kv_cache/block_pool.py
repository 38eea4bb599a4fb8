"""The fixed pool of KV blocks: pure bookkeeping (ids and reference counts), no tensors.

The tensors themselves are allocated once by the model runner; a block id here
indexes dimension 1 of every layer's cache tensor.

Every block is in exactly one of three states:

    free      ref 0, not cached      on the free list, handed out by `allocate`
    idle      ref 0, cached          holds a reusable prefix; `evict` turns it free
    in use    ref > 0                owned by sequences (cached or not)

`num_free` counts free and idle blocks together, since an idle block can always be
reclaimed; which idle block goes first is the eviction policy's choice, not the pool's.
"""

from __future__ import annotations

from collections import deque

from engine.errors import EngineError


class BlockPoolError(EngineError):
    """A bookkeeping invariant was broken (double free, allocation past capacity)."""


class BlockPool:
    """Hands out block ids and counts their references.

    A block shared by two sequences has a count of 2 and is released only when both
    let go; a released block that is cached becomes idle instead of free.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._cached = [False] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._idle: set[int] = set()

    @property
    def num_free(self) -> int:
        """Blocks that nobody references (free plus idle cached)."""
        return len(self._free) + len(self._idle)

    @property
    def num_uncached_free(self) -> int:
        """Blocks on the free list, allocatable without evicting anything."""
        return len(self._free)

    @property
    def num_idle(self) -> int:
        """Cached blocks that nobody references."""
        return len(self._idle)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return 1.0 - self.num_free / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        """Takes `n` free blocks, each with a reference count of 1."""
        if n > len(self._free):
            raise BlockPoolError(f"asked for {n} blocks with only {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(n)]
        for block_id in ids:
            self._ref_counts[block_id] = 1
        return ids

    def incref(self, block_ids: list[int]) -> list[int]:
        """Adds a reference to each block; returns the idle ones this revived.

        A free (uncached) block cannot be shared: its contents mean nothing.
        """
        revived: list[int] = []
        for block_id in block_ids:
            if self._ref_counts[block_id] <= 0:
                if block_id not in self._idle:
                    raise BlockPoolError(f"incref of free block {block_id}")
                self._idle.discard(block_id)
                revived.append(block_id)
            self._ref_counts[block_id] += 1
        return revived

    def free(self, block_ids: list[int]) -> list[int]:
        """Drops one reference from each block; returns the ids released (now free or idle).

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
                if self._cached[block_id]:
                    self._idle.add(block_id)
                else:
                    self._free.append(block_id)
                released.append(block_id)
        return released

    def mark_cached(self, block_id: int) -> None:
        """Flags an in-use block as holding a registered prefix (kept idle when released)."""
        if self._ref_counts[block_id] <= 0:
            raise BlockPoolError(f"only an in-use block can be cached, not {block_id}")
        self._cached[block_id] = True

    def is_cached(self, block_id: int) -> bool:
        """True while the block holds a registered prefix."""
        return self._cached[block_id]

    def is_idle(self, block_id: int) -> bool:
        """True for a cached block that nobody references."""
        return block_id in self._idle

    def evict(self, block_id: int) -> None:
        """Turns an idle cached block into a free one (its contents are forgotten)."""
        if block_id not in self._idle:
            raise BlockPoolError(f"evict of block {block_id}, which is not idle")
        self._idle.discard(block_id)
        self._cached[block_id] = False
        self._free.append(block_id)

    def uncache(self, block_id: int) -> None:
        """Clears the cached flag of an in-use block (it will be freed, not kept)."""
        if self._ref_counts[block_id] <= 0:
            raise BlockPoolError(f"uncache of unreferenced block {block_id}")
        self._cached[block_id] = False

    def check_integrity(self) -> None:
        """Asserts that free and idle blocks are exactly the unreferenced ones, by cached flag."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise BlockPoolError("a block appears twice in the free list")
        if free & self._idle:
            raise BlockPoolError("a block is both free and idle")
        unreferenced = {i for i, c in enumerate(self._ref_counts) if c == 0}
        if free | self._idle != unreferenced:
            raise BlockPoolError(
                f"free list and reference counts disagree: "
                f"{sorted((free | self._idle) ^ unreferenced)[:8]}"
            )
        if any(self._cached[b] for b in free) or any(not self._cached[b] for b in self._idle):
            raise BlockPoolError("cached flags disagree with the free and idle sets")
        if any(c < 0 for c in self._ref_counts):
            raise BlockPoolError("negative reference count")
