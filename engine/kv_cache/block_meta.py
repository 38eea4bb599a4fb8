"""The KV cache manager's bookkeeping records: per cached block, and per sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_cache.prefix_index import BlockKey, Chunk


@dataclass
class BlockMeta:
    """What the manager knows of one registered (cached) block."""

    domain: str
    parent: int | None
    children: int = 0
    tick: int = 0
    last_used: float = 0.0
    # Published blocks only: the prefix whose sequence registered the block, and its
    # depth in blocks (what decides whether the block stays pinned after a push).
    prefix: tuple[int, ...] = ()
    depth: int = 0
    # With a host tier: the block's chained hash on its domain's root and its tokens,
    # what it is written down under when the device pool evicts it (b"": never).
    tier_key: bytes = b""
    chunk: tuple[int, ...] = ()


@dataclass(frozen=True)
class ChainSegment:
    """A run of a sequence's blocks under one chain root (public or the sequence's key)."""

    root: bytes
    domain: str
    start: int  # first block index
    end: int | None  # one past the last block index; None: open-ended
    prefix: tuple[int, ...] = ()  # the published prefix of a public segment


@dataclass
class SeqCacheState:
    """One sequence's cache plan and progress: its segments, keys and registered blocks."""

    domain: str
    segments: tuple[ChainSegment, ...]
    admitted: bool = False  # holds blocks; False: a plan made at a lookup, not yet used
    registered: int = 0  # leading blocks of seq.block_ids that are registered
    locked: dict[int, int] = field(default_factory=dict)  # segment -> deepest block
    stopped: bool = False  # strict quota reached: register nothing more
    pending: tuple[int, int] | None = None  # (query tokens, hit tokens) of the last lookup
    # The sequence's full blocks so far, each cut and keyed once (`_extend_keys`): a
    # waiting sequence looked up on every step, or re-admitted after a preemption,
    # never hashes a block again. A block's tokens never change once it is full.
    chunks: list[Chunk] = field(default_factory=list)
    keys: list[BlockKey] = field(default_factory=list)
    # Digests of the token chain through each block (engine/kv_cache/in_flight.py),
    # the same for any index kind: what a running sequence claims to be computing.
    flight: list[tuple[bytes, int]] = field(default_factory=list)
    # Chained block hashes of the blocks (a host tier's keys): `keys` itself for the hash
    # index; for the radix index, whose keys are the chunks, computed when first needed.
    tier_keys: list[bytes] = field(default_factory=list)
