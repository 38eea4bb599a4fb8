"""The per-key-tile steps both paged attention kernels (decode, prefill) run.

A program walks its sequence's context a tile of keys at a time: `softmax_start` gives
the empty running state, `load_kv_tile` gathers the tile's K/V through the block table,
`tile_scores` scores it against the program's query rows (in log2 units, for exp2),
`online_softmax_step` folds the tile into the running max, sum and output, and
`softmax_output` normalises that output at the end. The kernels differ only in which
keys a row may see, the mask they apply between scoring and folding.
"""

# Triton kernels take untyped pointer arguments and triton.jit is untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.common import softcap_scores


@triton.jit
def softmax_start(ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """(m, l_sum, acc) before any key: running row max -inf, exp2 sum 0, output 0."""
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    return m, l_sum, acc


@triton.jit
def load_kv_tile(
    k_base,
    bt_row,
    start,
    lo,
    hi,
    d,
    d_mask,
    stride_c_kv,
    stride_c_blk,
    stride_c_tok,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    """(toks, t_mask, k, v): the positions of the TILE keys from `start`, which of them
    are in [lo, hi), and their K and V rows [TILE, BLOCK_D] (0 where masked). `k_base`
    points at the KV head's keys, `bt_row` at the sequence's block table row; each
    token's block is looked up, so a tile may span several blocks or part of one.

    Keys before `lo` (a window's start) are not read at all: their blocks may have been
    given back, and a masked score still multiplies its value (0 x NaN is NaN)."""
    toks = start + tl.arange(0, TILE)
    t_mask = (toks >= lo) & (toks < hi)
    blk = tl.load(bt_row + toks // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
    row = blk * stride_c_blk + (toks % BLOCK_SIZE) * stride_c_tok
    kv_mask = t_mask[:, None] & d_mask[None, :]
    k = tl.load(k_base + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(k_base + stride_c_kv + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return toks, t_mask, k, v


@triton.jit
def tile_scores(q, k, scale, softcap, DOT_PREC: tl.constexpr, SOFTCAP: tl.constexpr):
    """The scaled scores q.k of every query row and key of the tile, times log2(e) (exp2
    is the fast path). Gemma 2 caps the scaled scores before the mask (a hidden key
    stays at -inf, not at -softcap); log2(e) then goes on separately."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC)
    if SOFTCAP:
        s = softcap_scores(s * scale, softcap) * 1.4426950408889634
    else:
        s = s * (scale * 1.4426950408889634)
    return s


@triton.jit
def online_softmax_step(m, l_sum, acc, s, v, DOT_PREC: tl.constexpr):
    """(m, l_sum, acc) after one tile of masked log2 scores `s` and its values `v` (in
    the query's dtype): the running row max, exp2 sum and unnormalised output."""
    m_new = tl.maximum(m, tl.max(s, 1))
    # A row with no visible key yet (a prefill window's rows start at different keys)
    # keeps m = -inf: a 0 in its place avoids exp(-inf - -inf). A decode row always
    # sees a key of each tile it walks, so there it is m_new itself.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m - m_safe)
    l_sum = l_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_sum, acc


@triton.jit
def softmax_output(l_sum, acc):
    """The normalised output rows acc / l_sum; a row that saw no key (a zero-length
    padding sequence) gives zeros rather than 0/0."""
    denom = tl.where(l_sum > 0, l_sum, 1.0)
    return acc / denom[:, None]
