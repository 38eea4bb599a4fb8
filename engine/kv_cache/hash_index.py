"""Chained block hashes (after vLLM and nano-vllm): one dict probe per block.

    root ─► h0 = H(root, tokens[0:B]) ─► h1 = H(h0, tokens[B:2B]) ─► ...

The root is the cache key (or a continuation root), so equal tokens under two
keys give unrelated hashes. Token ids are compared on every hit, so even a hash
collision could not serve a wrong block.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.kv_cache.cache_key import block_hash
from engine.kv_cache.prefix_index import (
    BlockKey,
    Chunk,
    MatchResult,
    PrefixIndexError,
    block_chunks,
)


class HashIndex:
    """`PrefixIndex` over a flat dict from chained block hash to block id."""

    name = "hash"

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._tokens_of: dict[int, tuple[int, ...]] = {}
        self._root_of: dict[int, bytes] = {}
        self._children: dict[int, int] = {}
        self._parent_of: dict[int, int | None] = {}

    def __len__(self) -> int:
        return len(self._by_hash)

    def block_key(self, root: bytes, parent: BlockKey | None, chunk: Chunk) -> bytes:
        """The chained hash of one block: on its parent's hash, or on the root."""
        if parent is None:
            return block_hash(root, chunk)
        assert isinstance(parent, bytes)
        return block_hash(parent, chunk)

    def _keyed(
        self, root: bytes, parent: bytes | None, tokens: Sequence[int], n: int
    ) -> tuple[list[Chunk], list[BlockKey]]:
        chunks = block_chunks(tokens, self.block_size, n)
        keys: list[BlockKey] = []
        key: BlockKey | None = parent
        for chunk in chunks:
            key = self.block_key(root, key, chunk)
            keys.append(key)
        return chunks, keys

    def match(self, root: bytes, tokens: Sequence[int], max_blocks: int) -> MatchResult:
        """Hashes block by block, probing each, until the first miss."""
        bs = self.block_size
        found: list[int] = []
        parent = root
        probes = 0
        for i in range(min(max_blocks, len(tokens) // bs)):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = block_hash(parent, chunk)
            probes += 1
            block_id = self._by_hash.get(h)
            if block_id is None or self._tokens_of[block_id] != chunk:
                break
            found.append(block_id)
            parent = h
        return MatchResult(found, probes)

    def match_keys(
        self, root: bytes, chunks: Sequence[Chunk], keys: Sequence[BlockKey]
    ) -> MatchResult:
        """Probes block by block until the first miss; nothing is hashed."""
        found: list[int] = []
        probes = 0
        by_hash, tokens_of = self._by_hash, self._tokens_of
        for chunk, h in zip(chunks, keys, strict=True):
            probes += 1
            block_id = by_hash.get(h)  # type: ignore[arg-type]  # keys of this index are bytes
            if block_id is None or tokens_of[block_id] != chunk:
                break
            found.append(block_id)
        return MatchResult(found, probes)

    def insert(
        self, root: bytes, parent: int | None, tokens: Sequence[int], block_ids: Sequence[int]
    ) -> list[int]:
        """Registers each block under its chained hash, keeping any existing twin."""
        if len(tokens) != self.block_size * len(block_ids):
            raise PrefixIndexError("insert takes full blocks only")
        parent_hash = None if parent is None else self._hash_of[parent]
        chunks, keys = self._keyed(root, parent_hash, tokens, len(block_ids))
        return self.insert_keys(root, parent, chunks, keys, block_ids)

    def insert_keys(
        self,
        root: bytes,
        parent: int | None,
        chunks: Sequence[Chunk],
        keys: Sequence[BlockKey],
        block_ids: Sequence[int],
    ) -> list[int]:
        """`insert` with the blocks' chained hashes already computed."""
        if not len(chunks) == len(keys) == len(block_ids):
            raise PrefixIndexError("insert takes one chunk and one key per block")
        canonical: list[int] = []
        for chunk, h, block_id in zip(chunks, keys, block_ids, strict=True):
            assert isinstance(h, bytes)
            if len(chunk) != self.block_size:
                raise PrefixIndexError("insert takes full blocks only")
            existing = self._by_hash.get(h)
            if existing is not None:
                if self._tokens_of[existing] != chunk:
                    raise PrefixIndexError("block hash collision")
                canonical.append(existing)
            else:
                self._by_hash[h] = block_id
                self._hash_of[block_id] = h
                self._tokens_of[block_id] = chunk
                self._root_of[block_id] = root
                self._children[block_id] = 0
                self._parent_of[block_id] = parent
                if parent is not None:
                    self._children[parent] += 1
                canonical.append(block_id)
            parent = canonical[-1]
        return canonical

    def remove(self, block_id: int) -> None:
        """Drops a leaf block's entry."""
        if self._children.get(block_id, -1) != 0:
            raise PrefixIndexError(f"remove of block {block_id}, which is not a registered leaf")
        del self._by_hash[self._hash_of.pop(block_id)]
        del self._tokens_of[block_id], self._root_of[block_id], self._children[block_id]
        parent = self._parent_of.pop(block_id)
        if parent is not None:
            self._children[parent] -= 1

    def lock(self, block_id: int) -> None:
        """No-op: the pool's reference counts protect in-use blocks."""

    def unlock(self, block_id: int) -> None:
        """No-op, see `lock`."""

    def check_integrity(self) -> None:
        """Every entry is reachable both ways and child counts add up."""
        if len(self._hash_of) != len(self._by_hash):
            raise PrefixIndexError("hash maps disagree")
        counts: dict[int, int] = dict.fromkeys(self._children, 0)
        for block_id, parent in self._parent_of.items():
            if self._by_hash[self._hash_of[block_id]] != block_id:
                raise PrefixIndexError(f"block {block_id} is not under its own hash")
            if parent is not None:
                counts[parent] += 1
        if counts != self._children:
            raise PrefixIndexError("child counts disagree")
