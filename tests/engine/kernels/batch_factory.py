"""Builds random paged-attention batches (cache, block tables, metadata) for kernel tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
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


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Low-precision cases need real hardware: numpy (the interpreter) has no bfloat16.
DTYPES = [torch.float32] + ([torch.float16, torch.bfloat16] if DEVICE == "cuda" else [])
# The big shape matrices add only bf16 on CUDA: every case compiles its own kernel
# variant there, and the GPU check must stay within minutes.
MATRIX_DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def tolerance(dtype: torch.dtype) -> float:
    """Absolute and relative tolerance for comparing a kernel in `dtype` with fp32 math."""
    return _TOLERANCE[dtype]


def dtype_id(dtype: torch.dtype) -> str:
    """Short test id for a dtype parameter."""
    return str(dtype).removeprefix("torch.")


def reference_output(
    batch: PagedBatch, scale: float, window: int | None = None, softcap: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention output, cache after the write), computed naively in fp64, returned in fp32.

    Deliberately independent of the engine's torch backend (which may grow fast paths):
    token by token, position by position, straight from the definition. The inputs are
    the batch's own (possibly rounded) values, so only the kernel's arithmetic is judged.
    With a `window`, each row sees only its last `window` keys; with a `softcap`, each
    scaled score s is softcap * tanh(s / softcap) (Gemma 2).
    """
    m = batch.meta
    cache = batch.kv_cache.double().cpu().clone()
    block_size = cache.shape[2]
    k, v = batch.k.double().cpu(), batch.v.double().cpu()
    for row, slot in enumerate(m.slot_mapping.tolist()):
        if slot >= 0:
            cache[0, slot // block_size, slot % block_size] = k[row]
            cache[1, slot // block_size, slot % block_size] = v[row]
    q = batch.q.double().cpu()
    num_heads, num_kv_heads = q.shape[1], cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    tables = m.block_tables.cpu().tolist()
    start = 0
    for i, (q_len, s_len) in enumerate(zip(m.query_lens_cpu, m.seq_lens_cpu, strict=True)):
        pos = torch.arange(s_len)
        blocks = torch.tensor([tables[i][t // block_size] for t in range(s_len)], dtype=torch.long)
        keys = cache[0, blocks, pos % block_size]  # [s_len, kv_heads, D]
        values = cache[1, blocks, pos % block_size]
        for r in range(q_len):
            visible = s_len - q_len + r + 1  # causal: up to and including its own position
            first = 0 if window is None else max(0, visible - window)  # a window's start
            for h in range(num_heads):
                logits = keys[first:visible, h // group] @ q[start + r, h] * scale
                if softcap is not None:
                    logits = softcap * torch.tanh(logits / softcap)
                weights = torch.softmax(logits, 0)
                out[start + r, h] = weights @ values[first:visible, h // group]
        start += q_len
    return out.float().to(batch.q.device), cache.float().to(batch.q.device)


# (query heads, KV heads) of the attention kernels' shape matrix: group sizes 1, 3 and 8.
GQA = [(4, 4), (6, 2), (16, 2)]


def shape_matrix(test: Callable[..., None]) -> Callable[..., None]:
    """Parametrizes an attention-kernel test over the shared shape matrix: `dtype`
    (MATRIX_DTYPES) x `head_dim` (64, 128) x (`num_heads`, `num_kv_heads`) (GQA) x
    `block_size` (8, 16, 32)."""
    test = pytest.mark.parametrize("block_size", [8, 16, 32])(test)
    test = pytest.mark.parametrize(
        ("num_heads", "num_kv_heads"), GQA, ids=["gqa1", "gqa3", "gqa8"]
    )(test)
    test = pytest.mark.parametrize("head_dim", [64, 128])(test)
    return pytest.mark.parametrize("dtype", MATRIX_DTYPES, ids=dtype_id)(test)


def assert_matches_reference(
    run: Callable[[PagedBatch], torch.Tensor],
    spec: Sequence[tuple[int, int]],
    scale: float,
    *,
    dtype: torch.dtype,
    **shape: int,
) -> None:
    """Builds a batch on DEVICE from `spec` (`shape`: make_batch's sizes and seed), runs
    `run` on it and checks the output: in `dtype`, and equal to `reference_output`
    within the dtype's tolerance."""
    batch = device_batch(spec, dtype=dtype, **shape)
    expected, _ = reference_output(batch, scale)
    got = run(batch)
    assert got.dtype == dtype
    tol = tolerance(dtype)
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


def device_batch(spec: Sequence[tuple[int, int]], **options: Any) -> PagedBatch:
    """`make_batch` on DEVICE (CUDA when there is one, else the CPU for the interpreter)."""
    return make_batch(spec, device=DEVICE, **options)
