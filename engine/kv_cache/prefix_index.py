"""The prefix index interface: which cached KV blocks hold a given token prefix.

An index is pure bookkeeping over block ids; the manager owns reference counts,
eviction and domains. Every lookup starts from a chain root (a `CacheKey` digest,
or the continuation root after a published prefix), so a lookup never touches an
entry made under another root: that is the isolation invariant in data-structure
form, and `work` counts what a lookup touched so tests can prove it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

Chunk = tuple[int, ...]  # the tokens of one full block
# What an index looks a block up by, given its chain so far: a chained hash (hash
# index) or the block's own tokens (radix). Computed once per block of a sequence
# (`block_key`) and kept by the caller, so repeated lookups of a waiting sequence
# never redo it.
BlockKey = bytes | Chunk


def block_chunks(tokens: Sequence[int], block_size: int, n: int) -> list[Chunk]:
    """The first `n` full blocks of `tokens`, one chunk each."""
    return [tuple(tokens[i * block_size : (i + 1) * block_size]) for i in range(n)]


class MatchResult(NamedTuple):
    """The cached blocks of the longest block-aligned prefix, and the lookup's work."""

    block_ids: list[int]
    work: int  # dict probes (hash) or tree nodes visited (radix)


class PrefixIndex(Protocol):
    """Maps (chain root, full-block token runs) to KV block ids.

    Contract:
    - `match` is read-only and returns at most `max_blocks` blocks, each holding
      exactly the corresponding full block of `tokens`, under the same root.
    - `insert` registers full blocks that follow `parent` (None: the chain start).
      Where a block with the same prefix is already registered it is kept, and its
      id is returned in place of the new one (the caller adopts it, drops its copy).
    - `remove` drops a block that has no registered children.
    - `lock`/`unlock` mark the path ending at a block as in use (a no-op where the
      reference counts of the pool already suffice).
    - `block_key` is pure; `match_keys` / `insert_keys` are `match` / `insert` over
      chunks and keys the caller made with it (the key of a chain's first block has
      parent None), so that a caller that keeps them never computes one twice.
    """

    name: str
    block_size: int

    def match(self, root: bytes, tokens: Sequence[int], max_blocks: int) -> MatchResult:
        """Longest cached prefix of `tokens` under `root`, at most `max_blocks` blocks."""
        ...

    def insert(
        self, root: bytes, parent: int | None, tokens: Sequence[int], block_ids: Sequence[int]
    ) -> list[int]:
        """Registers `block_ids` (full blocks of `tokens`) after `parent`; canonical ids back."""
        ...

    def block_key(self, root: bytes, parent: BlockKey | None, chunk: Chunk) -> BlockKey:
        """The key of the block holding `chunk` after the block keyed `parent` (None: first)."""
        ...

    def match_keys(
        self, root: bytes, chunks: Sequence[Chunk], keys: Sequence[BlockKey]
    ) -> MatchResult:
        """`match` over whole blocks given with their keys (one block per chunk)."""
        ...

    def insert_keys(
        self,
        root: bytes,
        parent: int | None,
        chunks: Sequence[Chunk],
        keys: Sequence[BlockKey],
        block_ids: Sequence[int],
    ) -> list[int]:
        """`insert` over whole blocks given with their keys."""
        ...

    def remove(self, block_id: int) -> None:
        """Forgets a registered block without registered children."""
        ...

    def lock(self, block_id: int) -> None:
        """Protects the path from the root to `block_id` from removal."""
        ...

    def unlock(self, block_id: int) -> None:
        """Undoes one `lock` of the same block."""
        ...

    def __len__(self) -> int:
        """Registered blocks."""
        ...

    def check_integrity(self) -> None:
        """Raises if the index's internal invariants are broken."""
        ...


class PrefixIndexError(Exception):
    """An index invariant was broken (a bug, never a user error)."""
