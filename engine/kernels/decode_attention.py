"""Paged decode attention: one query token per sequence, GQA-aware, optional split-K.

Grid: (sequence, KV head, split). A program loads the query rows of every head in its
KV head's group at once ([BLOCK_G, head_dim], the group padded to >= 16 rows so that
`tl.dot` can run on tensor cores) and streams the keys of its context slice tile by
tile, so each K/V byte is read from memory once per group, not once per query head.

    context of sequence i:  |<-- split 0 -->|<-- split 1 -->| ... |<- split S-1 ->|
                             `part` tokens each (a multiple of TILE_N); empty tail
                             splits report m = -inf, l = 0 and weigh nothing.

A tile of TILE_N tokens may span several KV blocks (block_size < TILE_N) or part of
one; each token's address is looked up through the block table, so any block size
works. With one split the kernel normalises and writes the output directly; with more,
it writes (acc, m, l) per split and `_decode_reduce_kernel` merges them (log-sum-exp).
"""

# Triton kernels take untyped pointer arguments and triton.jit is untyped; the host
# launchers below are fully typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.attention_tiles import (
    load_kv_tile,
    online_softmax_step,
    softmax_output,
    softmax_start,
    tile_scores,
)
from engine.kernels.common import (
    check_paged_attention_inputs,
    dot_precision,
    next_pow2,
    num_sms,
    paged_attention_strides,
    window_and_softcap,
)

TILE_N = 32
PARTITION = 512  # tokens per split in the split-K variant; a multiple of TILE_N
MAX_SPLITS = 32


@triton.jit
def _decode_kernel(
    q_ptr,
    cache_ptr,
    out_ptr,
    acc_ptr,
    ml_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_c_kv,
    stride_c_blk,
    stride_c_tok,
    stride_c_h,
    stride_bt,
    head_dim,
    part,
    window,
    softcap,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PREC: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    lo = split * part
    hi = tl.minimum(seq_len, lo + part)
    # A sliding window: keys before its start are skipped (a split wholly before it
    # does no work, as a split past the sequence does).
    lo = tl.maximum(lo, seq_len - window)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < head_dim
    heads = kvh * GROUP + g
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m, l_sum, acc = softmax_start(BLOCK_G, BLOCK_D)
    k_base = cache_ptr + kvh * stride_c_h
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(lo, hi, TILE):
        _, t_mask, k, v = load_kv_tile(
            k_base, bt_row, start, lo, hi, d, d_mask, stride_c_kv, stride_c_blk, stride_c_tok,
            BLOCK_SIZE, TILE,
        )  # fmt: skip
        s = tile_scores(q, k, scale, softcap, DOT_PREC, SOFTCAP)
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m, l_sum, acc = online_softmax_step(m, l_sum, acc, s, v.to(q.dtype), DOT_PREC)

    out_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        o = softmax_output(l_sum, acc)
        dst = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # Scratch layout: acc [seqs, heads, splits, BLOCK_D]; ml [seqs, heads, splits, 2].
        num_heads = tl.num_programs(1) * GROUP
        part = (seq * num_heads + heads) * NUM_SPLITS + split
        tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=out_mask)
        tl.store(ml_ptr + part * 2, m, mask=g_mask)
        tl.store(ml_ptr + part * 2 + 1, l_sum, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    acc_ptr,
    ml_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    head_dim,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    base = (seq * num_heads + head) * NUM_SPLITS
    m = tl.load(ml_ptr + (base + s) * 2, mask=s_mask, other=float("-inf"))
    l_sum = tl.load(ml_ptr + (base + s) * 2 + 1, mask=s_mask, other=0.0)
    m_max = tl.max(m, 0)
    # Empty splits have m = -inf; guard the all-empty case (zero-length padding rows).
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_ref)
    acc = tl.load(
        acc_ptr + (base + s)[:, None] * BLOCK_D + d[None, :],
        mask=s_mask[:, None] & (d[None, :] < head_dim),
        other=0.0,
    )
    num = tl.sum(acc * w[:, None], 0)
    den = tl.sum(l_sum * w, 0)
    den = tl.where(den > 0, den, 1.0)
    o = num / den
    dst = out_ptr + seq * stride_ot + head * stride_oh + d
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=d < head_dim)


def choose_num_splits(max_seq_len: int, num_programs: int, sm_count: int) -> int:
    """Split count for a decode batch: 1 unless the context is long and the grid is thin.

    Splitting pays when (sequences x KV heads) programs leave SMs idle and each program
    would stream a long context; it costs an extra scratch write and a reduction launch.
    """
    if max_seq_len <= PARTITION:
        return 1
    by_length = triton.cdiv(max_seq_len, PARTITION)
    # Aim for about two waves of programs over the SMs; never split an already full grid.
    wanted = triton.cdiv(2 * max(sm_count, 1), max(num_programs, 1))
    return int(max(1, min(by_length, wanted, MAX_SPLITS)))


def decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context (its last
    `window` keys with a sliding window; with `softcap`, each scaled score s becomes
    softcap * tanh(s / softcap) first).

    q: [num_seqs, num_heads, head_dim] (row i belongs to sequence i); kv_cache:
    [2, blocks, block_size, kv_heads, head_dim]; block_tables: int32 [num_seqs, max_blocks];
    seq_lens: int32 [num_seqs] (context including the token itself, already in the cache).
    `num_splits` overrides the split-K heuristic (tests use it to force both paths).
    Returns out: [num_seqs, num_heads, head_dim] in q's dtype.
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = check_paged_attention_inputs(q, kv_cache, softcap)
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = choose_num_splits(max_seq_len, num_seqs * num_kv_heads, num_sms(q.device))
    block_d = next_pow2(head_dim)
    # Each split covers `part` tokens (a TILE_N multiple) so the splits tile max_seq_len.
    part = max(TILE_N, triton.cdiv(triton.cdiv(max(max_seq_len, 1), num_splits), TILE_N) * TILE_N)
    if num_splits > 1:
        acc = torch.empty(
            num_seqs, num_heads, num_splits, block_d, dtype=torch.float32, device=q.device
        )
        ml = torch.empty(num_seqs, num_heads, num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # unused by the single-split path
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        kv_cache,
        out,
        acc,
        ml,
        block_tables,
        seq_lens,
        scale,
        *paged_attention_strides(q, out, kv_cache, block_tables),
        head_dim,
        part,
        *window_and_softcap(window, softcap),
        GROUP=group,
        BLOCK_G=max(16, next_pow2(group)),
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        TILE=TILE_N,
        NUM_SPLITS=num_splits,
        DOT_PREC=dot_precision(q.dtype),
        SOFTCAP=softcap is not None,
        num_warps=4,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            acc,
            ml,
            out,
            out.stride(0),
            out.stride(1),
            head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
            BLOCK_S=next_pow2(num_splits),
        )
    return out
