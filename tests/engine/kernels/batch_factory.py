"""Builds random paged-attention batches (cache, block tables, metadata) for kernel tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionMetadata


@dataclass(frozen=True)
class PagedBatch:
    """One step's inputs: q/k/v for the new tokens, a prefilled cache and the metadata."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    meta: AttentionMetadata


def make_batch(
    spec: Sequence[tuple[int, int]],
    *,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    pad_slots: int = 0,
) -> PagedBatch:
    """spec lists (context_len, query_len) per sequence.

    Blocks are handed out in a shuffled order (so tables are not contiguous), the cached
    prefix is filled with random K/V, and the unused part of the pool holds garbage so a
    kernel that reads past a sequence's end gives a wrong answer. `pad_slots` appends
    that many padding tokens (slot -1) after the real ones, as a padded batch would have.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-(c + n) // block_size) for c, n in spec]
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_seq)
    tables = torch.zeros(len(spec), max_blocks, dtype=torch.int32)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    slots: list[int] = []
    next_block = 0
    for i, ((ctx, n), nb) in enumerate(zip(spec, blocks_per_seq, strict=True)):
        blocks = order[next_block : next_block + nb]
        next_block += nb
        tables[i, :nb] = torch.tensor(blocks, dtype=torch.int32)
        for t in range(ctx, ctx + n):
            slots.append(blocks[t // block_size] * block_size + t % block_size)
    slots += [-1] * pad_slots
    num_tokens = len(slots)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    query_lens = [n for _, n in spec]
    seq_lens = [c + n for c, n in spec]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    dev = torch.device(device)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=tuple(query_lens),
        seq_lens_cpu=tuple(seq_lens),
    )
    return PagedBatch(
        q=q.to(dev, dtype),
        k=k.to(dev, dtype),
        v=v.to(dev, dtype),
        kv_cache=kv_cache.to(dev, dtype),
        meta=meta,
    )
