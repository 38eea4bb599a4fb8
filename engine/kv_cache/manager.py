"""Per-sequence block tables on top of the shared block pool.

The scheduler talks to this class only (never to the pool): it asks whether a
sequence can grow by some tokens, and the manager allocates the blocks those
tokens need. Prefix reuse plugs in through `get_computed_blocks`.
"""

from __future__ import annotations

from engine.kv_cache.block_pool import BlockPool
from engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


class KVCacheManager:
    """Allocates and frees the blocks of each sequence's block table.

    Block table layout: token t of a sequence lives in `seq.block_ids[t // block_size]`
    at offset `t % block_size`.
    """

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size

    @property
    def num_blocks(self) -> int:
        """Blocks in the whole pool."""
        return self.pool.num_blocks

    @property
    def usage(self) -> float:
        """Fraction of the pool in use."""
        return self.pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return cdiv(num_tokens, self.block_size)

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """Blocks already holding a prefix of `seq`, and how many tokens they cover.

        Without a prefix index nothing is ever reused.
        """
        return [], 0

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        """Makes room for `num_new_tokens` more tokens of `seq`; False if the pool is short.

        On False nothing changed. `computed_blocks` (only on first admission) are
        prefix blocks the sequence adopts instead of computing them.
        """
        computed_blocks = computed_blocks or []
        have = len(seq.block_ids) + len(computed_blocks)
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - have
        if need > 0 and not self.pool.can_allocate(need):
            return False
        if computed_blocks:
            self.pool.incref(computed_blocks)
            seq.block_ids.extend(computed_blocks)
        if need > 0:
            seq.block_ids.extend(self.pool.allocate(need))
        return True

    def free(self, seq: Sequence) -> None:
        """Returns the sequence's blocks to the pool (shared ones stay with their other owners)."""
        if seq.block_ids:
            self.pool.free(seq.block_ids)
            seq.block_ids = []

    def check_integrity(self) -> None:
        """Delegates to the pool's invariant check."""
        self.pool.check_integrity()
