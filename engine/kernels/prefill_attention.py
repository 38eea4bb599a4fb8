"""Paged prefill attention for a variable-length batch (chunked prefill, mixed batches).

Each sequence's new tokens are rows `query_start_loc[i]:query_start_loc[i+1]` of q; its
K/V (cached prefix and the new tokens alike, the backend has just written them) are
read from the paged cache through the block table:

    keys:    0 ............ context_len ............ seq_len
             |<- prefix: all visible ->|<- new: causal ->|
    query row r sits at position context_len + r and sees keys 0..context_len + r
    (with a sliding window W, only the last W of them: context_len + r - W + 1 on;
    with a soft cap C, each score s = q.k * scale is C * tanh(s / C) before the mask)

Grid: (sequence, query tile of BLOCK_M rows, query head). A program streams key tiles
of BLOCK_N tokens with an online softmax and stops at the last key its tile can see,
so the causal upper triangle is never loaded. Tiles past a sequence's query length do
no work (their loop bound is 0) and store nothing. A query length of 1 is just a
one-row tile, which is how decode rows of a mixed batch go through this kernel.
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
    paged_attention_strides,
    window_and_softcap,
)


@triton.jit
def _prefill_kernel(
    q_ptr,
    cache_ptr,
    out_ptr,
    block_tables_ptr,
    query_start_ptr,
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
    window,
    softcap,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    m_tile = tl.program_id(1)
    head = tl.program_id(2)
    kvh = head // GROUP
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len

    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    r_mask = rows < q_len
    d_mask = d < head_dim
    q_rows = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=r_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = ctx_len + rows
    # The last row of this tile sees keys up to its own position; later keys are skipped.
    kv_hi = tl.minimum(seq_len, ctx_len + (m_tile + 1) * BLOCK_M)
    kv_hi = tl.where(m_tile * BLOCK_M < q_len, kv_hi, 0)
    # The first row of this tile sees keys from its window's start; earlier ones are
    # skipped (window is 2**30 without one, so this is 0).
    kv_first = tl.maximum(ctx_len + m_tile * BLOCK_M - window + 1, 0)
    kv_lo = (kv_first // BLOCK_N) * BLOCK_N

    m, l_sum, acc = softmax_start(BLOCK_M, BLOCK_D)
    k_base = cache_ptr + kvh * stride_c_h
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(kv_lo, kv_hi, BLOCK_N):
        toks, t_mask, k, v = load_kv_tile(
            k_base, bt_row, start, kv_first, kv_hi, d, d_mask, stride_c_kv, stride_c_blk,
            stride_c_tok, BLOCK_SIZE, BLOCK_N,
        )  # fmt: skip
        s = tile_scores(q, k, scale, softcap, DOT_PREC, SOFTCAP)
        visible = t_mask[None, :] & (toks[None, :] <= q_pos[:, None])
        visible = visible & (toks[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m, l_sum, acc = online_softmax_step(m, l_sum, acc, s, v.to(q.dtype), DOT_PREC)

    o = softmax_output(l_sum, acc)
    dst = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :])


def prefill_tile_sizes(max_query_len: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): query rows and keys per tile.

    Rows shrink to the batch's longest query (never under 16, the `tl.dot` minimum) so
    short chunks and decode rows do not pay for empty rows; keys per tile shrink with
    the head size to keep the K/V tiles in registers.
    """
    block_m = min(64, max(16, next_pow2(max_query_len)))
    block_n = 64 if head_dim <= 64 else 32
    return block_m, block_n


def prefill_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of every new token over its sequence's paged context (its last
    `window` keys with a sliding window; with `softcap`, each scaled score s becomes
    softcap * tanh(s / softcap) before the mask).

    q: [num_tokens, num_heads, head_dim]; kv_cache: [2, blocks, block_size, kv_heads,
    head_dim] already holding the new tokens' K/V; block_tables int32 [num_seqs, max_blocks];
    query_start_loc int32 [num_seqs + 1]; seq_lens int32 [num_seqs]. Rows of q past
    query_start_loc[-1] (padding) are left untouched in `out`.
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = check_paged_attention_inputs(q, kv_cache, softcap)
    if out is None:
        out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or num_tokens == 0 or max_query_len == 0:
        return out
    block_m, block_n = prefill_tile_sizes(max_query_len, head_dim)
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        q,
        kv_cache,
        out,
        block_tables,
        query_start_loc,
        seq_lens,
        scale,
        *paged_attention_strides(q, out, kv_cache, block_tables),
        head_dim,
        *window_and_softcap(window, softcap),
        GROUP=num_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=next_pow2(head_dim),
        BLOCK_SIZE=block_size,
        DOT_PREC=dot_precision(q.dtype),
        SOFTCAP=softcap is not None,
        num_warps=4 if block_m < 64 else 8,
    )
    return out
