"""A radix tree of token runs per chain root (after SGLang's RadixCache).

Each edge holds a run of whole blocks; children are keyed by their first block's
tokens. Inserting after a node always adds a new child (edges never grow), and a
node splits at a block boundary where a lock or an insert needs a path to end:

    before lock(b2):   root ─[b1 b2 b3]─►          after:   root ─[b1 b2]─► ─[b3]─►
                                                                 lock_ref=1   lock_ref=0

`lock_ref` counts the in-use paths through a node; only an unlocked leaf's last
block can be removed. Lookups walk the caller's own tree only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.kv_cache.prefix_index import (
    BlockKey,
    Chunk,
    MatchResult,
    PrefixIndexError,
    block_chunks,
)


@dataclass(eq=False)
class _Node:
    chunks: list[Chunk]  # one token run per block on the edge into this node
    blocks: list[int]
    parent: _Node | None
    children: dict[Chunk, _Node] = field(default_factory=dict)
    lock_ref: int = 0


class RadixIndex:
    """`PrefixIndex` with one tree per chain root."""

    name = "radix"

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._trees: dict[bytes, _Node] = {}
        self._node_of: dict[int, _Node] = {}
        self._tree_of: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self._node_of)

    def block_key(self, root: bytes, parent: BlockKey | None, chunk: Chunk) -> Chunk:
        """A block's own tokens: the tree is keyed by them, under the root's tree."""
        return chunk

    def match(self, root: bytes, tokens: Sequence[int], max_blocks: int) -> MatchResult:
        """Walks down the root's tree while whole blocks agree."""
        n = min(max_blocks, len(tokens) // self.block_size)
        if n == 0:
            return MatchResult([], 1)
        return self._walk(root, block_chunks(tokens, self.block_size, n))

    def match_keys(
        self, root: bytes, chunks: Sequence[Chunk], keys: Sequence[BlockKey]
    ) -> MatchResult:
        """`match` over chunks already cut (the keys are the chunks themselves)."""
        return self._walk(root, chunks)

    def _walk(self, root: bytes, chunks: Sequence[Chunk]) -> MatchResult:
        n = len(chunks)
        node = self._trees.get(root)
        visited = 1
        found: list[int] = []
        if node is None or n == 0:
            return MatchResult(found, visited)
        while len(found) < n:
            child = node.children.get(chunks[len(found)])
            if child is None:
                break
            visited += 1
            j = 0
            while (
                j < len(child.blocks) and len(found) < n and child.chunks[j] == chunks[len(found)]
            ):
                found.append(child.blocks[j])
                j += 1
            if j < len(child.blocks):
                break
            node = child
        return MatchResult(found, visited)

    def insert(
        self, root: bytes, parent: int | None, tokens: Sequence[int], block_ids: Sequence[int]
    ) -> list[int]:
        """Follows existing edges where blocks agree, then hangs the rest as one new node."""
        if len(tokens) != self.block_size * len(block_ids):
            raise PrefixIndexError("insert takes full blocks only")
        chunks = block_chunks(tokens, self.block_size, len(block_ids))
        return self.insert_keys(root, parent, chunks, chunks, block_ids)

    def insert_keys(
        self,
        root: bytes,
        parent: int | None,
        chunks: Sequence[Chunk],
        keys: Sequence[BlockKey],
        block_ids: Sequence[int],
    ) -> list[int]:
        """`insert` over chunks already cut (the keys are the chunks themselves)."""
        if len(chunks) != len(block_ids) or any(len(c) != self.block_size for c in chunks):
            raise PrefixIndexError("insert takes full blocks only")
        if parent is None:
            node = self._trees.setdefault(root, _Node([], [], None))
        else:
            node = self._end_node_at(parent)
        canonical: list[int] = []
        i = 0
        while i < len(chunks):
            child = node.children.get(chunks[i])
            if child is None:
                new = _Node(list(chunks[i:]), list(block_ids[i:]), node)
                node.children[chunks[i]] = new
                for b in new.blocks:
                    self._node_of[b] = new
                    self._tree_of[b] = root
                canonical.extend(new.blocks)
                break
            j = 0
            while j < len(child.blocks) and i < len(chunks) and child.chunks[j] == chunks[i]:
                canonical.append(child.blocks[j])
                i += 1
                j += 1
            if j < len(child.blocks) and i < len(chunks):
                child = self._split(child, j)
            node = child
        return canonical

    def _end_node_at(self, block_id: int) -> _Node:
        """The node whose edge ends with `block_id`, splitting its edge if needed."""
        node = self._node_of[block_id]
        k = node.blocks.index(block_id)
        if k + 1 < len(node.blocks):
            node = self._split(node, k + 1)
        return node

    def _split(self, node: _Node, j: int) -> _Node:
        """Cuts `node`'s edge after `j` blocks; returns the new upper node."""
        assert node.parent is not None and 0 < j < len(node.blocks)
        upper = _Node(node.chunks[:j], node.blocks[:j], node.parent, lock_ref=node.lock_ref)
        node.parent.children[node.chunks[0]] = upper
        node.chunks, node.blocks, node.parent = node.chunks[j:], node.blocks[j:], upper
        upper.children[node.chunks[0]] = node
        for b in upper.blocks:
            self._node_of[b] = upper
        return upper

    def remove(self, block_id: int) -> None:
        """Trims the last block off an unlocked leaf."""
        node = self._node_of.get(block_id)
        if node is None or node.blocks[-1] != block_id or node.children:
            raise PrefixIndexError(f"remove of block {block_id}, which is not a leaf's last block")
        if node.lock_ref:
            raise PrefixIndexError(f"remove of locked block {block_id}")
        node.blocks.pop()
        node.chunks.pop()
        del self._node_of[block_id]
        root = self._tree_of.pop(block_id)
        if not node.blocks:
            assert node.parent is not None
            first = next(k for k, v in node.parent.children.items() if v is node)
            del node.parent.children[first]
            tree = self._trees[root]
            if not tree.children:
                del self._trees[root]

    def lock(self, block_id: int) -> None:
        """Adds one lock to every node from `block_id`'s node up to the root."""
        node: _Node | None = self._end_node_at(block_id)
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, block_id: int) -> None:
        """Removes one lock along the same path."""
        node: _Node | None = self._node_of[block_id]
        while node is not None:
            if node.lock_ref <= 0:
                raise PrefixIndexError(f"unlock of unlocked block {block_id}")
            node.lock_ref -= 1
            node = node.parent

    def check_integrity(self) -> None:
        """Parent links, child keys, block maps and lock counts agree."""
        seen = 0
        for root, tree in self._trees.items():
            stack = [tree]
            while stack:
                node = stack.pop()
                if len(node.chunks) != len(node.blocks):
                    raise PrefixIndexError("edge runs and blocks disagree")
                child_locks = 0
                for key, child in node.children.items():
                    if child.parent is not node or child.chunks[0] != key or not child.blocks:
                        raise PrefixIndexError("bad child link")
                    child_locks += child.lock_ref
                    stack.append(child)
                if node.lock_ref < child_locks:
                    raise PrefixIndexError("a node has fewer locks than its children")
                for b in node.blocks:
                    if self._node_of.get(b) is not node or self._tree_of.get(b) != root:
                        raise PrefixIndexError(f"block {b} is mapped to another node")
                    seen += 1
        if seen != len(self._node_of):
            raise PrefixIndexError("blocks mapped outside every tree")
