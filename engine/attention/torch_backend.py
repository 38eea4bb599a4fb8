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
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns one sequence's K and V, [seq_len, num_kv_heads, head_dim] each."""
    block_size = kv_cache.shape[2]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    k = kv_cache[0, blocks].flatten(0, 1)[:seq_len]
    v = kv_cache[1, blocks].flatten(0, 1)[:seq_len]
    return k, v


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
    ) -> torch.Tensor:
        """Stores the new K/V; decode rows attend in one batched call, prefill rows one by one."""
        write_kv(k, v, kv_cache, meta.slot_mapping)
        num_heads, num_kv_heads = q.shape[1], kv_cache.shape[3]
        group = num_heads // num_kv_heads
        out = torch.empty_like(q)
        decode_rows = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        if len(decode_rows) > 1:
            _batched_decode(q, kv_cache, meta, scale, decode_rows, out)
            done = set(decode_rows)
        else:
            done = set()
        start = 0
        for i, (q_len, s_len) in enumerate(
            zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)
        ):
            if q_len == 0 or i in done:
                start += q_len
                continue
            qi = q[start : start + q_len].transpose(0, 1)  # [H, q_len, D]
            ki, vi = gather_kv(kv_cache, meta.block_tables[i], s_len)
            ki = ki.to(q.dtype).transpose(0, 1).repeat_interleave(group, dim=0)
            vi = vi.to(q.dtype).transpose(0, 1).repeat_interleave(group, dim=0)
            mask = _causal_mask(q_len, s_len, q.device)
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale)
            out[start : start + q_len] = oi.transpose(0, 1)
            start += q_len
        return out


def _batched_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    rows: list[int],
    out: torch.Tensor,
) -> None:
    """One-token queries of many sequences at once, over K/V gathered into a padded batch."""
    starts = meta.query_start_loc.tolist() if len(rows) != meta.num_seqs else None
    token_rows = [starts[i] for i in rows] if starts is not None else rows
    index = torch.tensor(token_rows, device=q.device)
    seq_index = torch.tensor(rows, device=q.device)
    lens = meta.seq_lens.index_select(0, seq_index).long()
    block_size, num_kv_heads, head_dim = kv_cache.shape[2], kv_cache.shape[3], kv_cache.shape[4]
    max_len = int(max(meta.seq_lens_cpu[i] for i in rows))
    num_blocks = (max_len + block_size - 1) // block_size
    tables = meta.block_tables.index_select(0, seq_index)[:, :num_blocks].long()
    b = len(rows)
    keys = kv_cache[0][tables].reshape(b, num_blocks * block_size, num_kv_heads, head_dim)
    values = kv_cache[1][tables].reshape(b, num_blocks * block_size, num_kv_heads, head_dim)
    group = q.shape[1] // num_kv_heads
    qb = q.index_select(0, index).reshape(b, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bthd->bhgt", qb, keys.to(q.dtype)) * scale
    valid = torch.arange(num_blocks * block_size, device=q.device).unsqueeze(0) < lens.unsqueeze(1)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    ob = torch.einsum("bhgt,bthd->bhgd", probs, values.to(q.dtype))
    out.index_copy_(0, index, ob.reshape(b, q.shape[1], head_dim))


def _causal_mask(q_len: int, s_len: int, device: torch.device) -> torch.Tensor | None:
    """Query row r (absolute position s_len - q_len + r) sees keys up to that position."""
    if q_len == 1:
        return None
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (s_len - q_len)
    cols = torch.arange(s_len, device=device).unsqueeze(0)
    return cols <= rows
