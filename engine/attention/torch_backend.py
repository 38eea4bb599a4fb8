"""Reference attention in plain torch: reads K/V back through the block tables.

It runs anywhere (the CPU included) and is the oracle the triton kernels are
tested against, so it favours clarity over speed: one sequence at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionMetadata


def write_kv(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Stores each new token's K/V at its flat slot; negative slots are padding."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    flat[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def gather_kv(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, skip_blocks: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns one sequence's K and V from its block `skip_blocks` on (position
    skip_blocks * block_size) to `seq_len`, [positions, num_kv_heads, head_dim] each."""
    block_size = kv_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    table = block_table[skip_blocks:num_blocks].long()
    # index_select copies whole blocks (memcpy rows); advanced indexing goes element-wise.
    kv = kv_cache.index_select(1, table).flatten(1, 2)
    end = seq_len - skip_blocks * block_size
    return kv[0, :end], kv[1, :end]


class TorchAttentionBackend:
    """Correct everywhere, fast nowhere: the CPU path and the kernels' oracle."""

    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Stores the new K/V; decode rows attend in one batched call, prefill rows one by one."""
        write_kv(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        done = set(self._decode(q, kv_cache, meta, scale, out, window, softcap))
        start = 0
        for i, q_len in enumerate(meta.query_lens_cpu):
            if q_len and i not in done:
                rows = slice(start, start + q_len)
                out[rows] = _attend_one(
                    q[rows], k[rows], v[rows], kv_cache, meta, i, scale, window, softcap
                )
            start += q_len
        return out

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
        window: int | None,
        softcap: float | None = None,
    ) -> list[int]:
        """Attends the one-token sequences into `out` in one batch and returns them; an
        empty list leaves them to the per-sequence path (a single one is cheaper there)."""
        rows = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        if len(rows) < 2:
            return []
        _batched_decode(q, kv_cache, meta, scale, rows, out, window, softcap)
        return rows


def _attend_one(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    seq: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """One sequence's new tokens over its cached prefix (read back) and themselves.

    The new tokens' K/V are taken from this step (rounded through the cache dtype, so
    the result equals reading them back) rather than gathered again from the pool.
    """
    q_len, s_len = q.shape[0], meta.seq_lens_cpu[seq]
    ctx_len = s_len - q_len
    k_new = k_new.to(kv_cache.dtype).to(q.dtype)
    v_new = v_new.to(kv_cache.dtype).to(q.dtype)
    # With a window, the context is read from the block holding the first row's earliest
    # key on: the blocks before it may have been given back (their table entries then
    # name block 0, whose contents are anyone's). The masks shift with the keys' start;
    # they only compare a key's position with its row's.
    skip = 0
    if window is not None:
        skip = max(0, ctx_len - window + 1) // kv_cache.shape[2]
    if ctx_len:
        k_ctx, v_ctx = gather_kv(kv_cache, meta.block_tables[seq], ctx_len, skip)
        k_all = torch.cat([k_ctx.to(q.dtype), k_new])
        v_all = torch.cat([v_ctx.to(q.dtype), v_new])
    else:
        k_all, v_all = k_new, v_new
    s_len, ctx_len = s_len - skip * kv_cache.shape[2], ctx_len - skip * kv_cache.shape[2]
    windowed = window is not None and window < s_len
    # The soft-capped path takes its causal part from the mask too (it has no is_causal).
    masked = windowed or (ctx_len and q_len > 1) or (softcap is not None and q_len > 1)
    mask = _causal_mask(q_len, s_len, q.device, q.dtype, window) if masked else None
    # 4-D contiguous [1, heads, len, D] inputs keep SDPA on its fused CPU kernel; 3-D or
    # strided ones fall back to the much slower math path.
    q4 = q.transpose(0, 1).unsqueeze(0).contiguous()
    k4 = k_all.transpose(0, 1).unsqueeze(0).contiguous()
    v4 = v_all.transpose(0, 1).unsqueeze(0).contiguous()
    if softcap is not None:
        o = softcapped_attention(q4, k4, v4, mask, scale, softcap)
    else:
        causal = not masked and q_len > 1
        o = F.scaled_dot_product_attention(
            q4, k4, v4, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
        )
    return o[0].transpose(0, 1)


# Scores held at once by the soft-capped path (float32 elements, 256 MiB): longer
# queries go through in chunks of rows, so a long prefill chunk never needs
# heads x q_len x s_len floats.
_SCORE_ELEMENTS = 1 << 26


def softcapped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """Attention whose scaled scores s become softcap * tanh(s / softcap) before the
    additive `mask` and the softmax (Gemma 2), in float32, returned in q's dtype.

    SDPA has no such cap, so the math is spelt out. q: [b, heads, q_len, D]; k, v:
    [b, kv_heads, s_len, D] (GQA: head h reads KV head h // group); mask broadcasts to
    [b, heads, q_len, s_len] (or is None).
    """
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, 1).transpose(-1, -2)
    values = v.float().repeat_interleave(group, 1)
    q_len, s_len = q.shape[2], k.shape[2]
    step = max(1, _SCORE_ELEMENTS // max(1, q.shape[0] * q.shape[1] * s_len))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for lo in range(0, q_len, step):
        rows = slice(lo, min(q_len, lo + step))
        scores = torch.matmul(q[:, :, rows].float(), keys) * scale
        scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            # The mask adds after the cap: a hidden key stays at -inf, not at -softcap.
            scores += mask[..., rows, :] if mask.shape[-2] > 1 else mask
        out[:, :, rows] = torch.matmul(torch.softmax(scores, -1), values).to(q.dtype)
    return out


def _batched_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    rows: list[int],
    out: torch.Tensor,
    window: int | None = None,
    softcap: float | None = None,
) -> None:
    """One-token queries of many sequences at once, over K/V gathered into a padded batch."""
    index = torch.tensor(token_rows(meta, rows), device=q.device)
    seq_index = torch.tensor(rows, device=q.device)
    lens = meta.seq_lens.index_select(0, seq_index).long()
    block_size, num_kv_heads, head_dim = kv_cache.shape[2], kv_cache.shape[3], kv_cache.shape[4]
    max_len = int(max(meta.seq_lens_cpu[i] for i in rows))
    num_blocks = (max_len + block_size - 1) // block_size
    tables = meta.block_tables.index_select(0, seq_index)[:, :num_blocks].long()
    b, width = len(rows), num_blocks * block_size
    # One block-wise gather for K and V together (index_select copies whole blocks;
    # advanced indexing went element by element and cost twice the attention itself),
    # then [b, width, kv_heads, D] viewed as [b, kv_heads, width, D] without a copy.
    kv = kv_cache.index_select(1, tables.reshape(-1)).view(2, b, width, num_kv_heads, head_dim)
    keys, values = kv[0].transpose(1, 2), kv[1].transpose(1, 2)
    positions = torch.arange(width, device=q.device).unsqueeze(0)
    valid = positions < lens.unsqueeze(1)
    if window is not None:  # only the last `window` positions (the token's included)
        valid &= positions >= lens.unsqueeze(1) - window
    # The padding reads cells that are not the sequence's (a zero-padded table's block 0,
    # a reused block's stale tail): zeroed, as a masked NaN there would still give NaN.
    kv.masked_fill_(~valid[None, :, :, None, None], 0.0)
    mask = torch.zeros((b, 1, 1, width), dtype=q.dtype, device=q.device)
    mask.masked_fill_(~valid[:, None, None, :], float("-inf"))
    qb = q.index_select(0, index).unsqueeze(2)  # [b, heads, 1, D]
    if softcap is not None:
        ob = softcapped_attention(qb, keys, values, mask, scale, softcap)
    else:
        ob = F.scaled_dot_product_attention(
            qb, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale, enable_gqa=True
        )
    out.index_copy_(0, index, ob.squeeze(2))


def token_rows(meta: AttentionMetadata, seqs: list[int]) -> list[int]:
    """The flat-batch row of each one-token sequence in `seqs` (sequence i is row i when
    every sequence decodes)."""
    if len(seqs) == meta.num_seqs:
        return seqs
    starts = meta.query_start_loc.tolist()
    return [starts[i] for i in seqs]


def _causal_mask(
    q_len: int,
    s_len: int,
    device: torch.device,
    dtype: torch.dtype,
    window: int | None = None,
) -> torch.Tensor:
    """Additive mask: query row r (absolute position s_len - q_len + r) sees keys up to it
    (with a `window`, only the last `window` of them).

    A float mask, not a boolean one, keeps SDPA on its fused CPU kernel.
    """
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (s_len - q_len)
    cols = torch.arange(s_len, device=device).unsqueeze(0)
    hidden = cols > rows
    if window is not None:
        hidden |= cols <= rows - window
    mask = torch.zeros((q_len, s_len), dtype=dtype, device=device)
    return mask.masked_fill_(hidden, float("-inf"))
