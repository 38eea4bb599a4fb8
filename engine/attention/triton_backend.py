"""Attention through the triton kernels: the GPU path, drop-in for the torch reference.

Per layer and step: store the new K/V with one kernel, then attend with either the
decode kernel (every sequence adds one token: one program per sequence and KV head,
split-K for long contexts) or the prefill kernel (anything else, mixed batches
included: a decode row is a one-row query tile there). Both read all keys, the new
ones included, from the paged cache. On a machine without CUDA it runs on CPU tensors
under TRITON_INTERPRET=1 (slowly; that is how the kernels are tested).
"""

from __future__ import annotations

import torch

from engine.attention.backend import AttentionMetadata
from engine.kernels.decode_attention import decode_attention
from engine.kernels.kv_write import kv_write
from engine.kernels.prefill_attention import prefill_attention


class TritonAttentionBackend:
    """Paged attention with triton kernels; same contract as `TorchAttentionBackend`."""

    name = "triton"

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
        """Stores the new K/V, then returns attention for the new tokens ([T, H, D])."""
        kv_write(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        num_seqs = meta.num_seqs
        if num_seqs == 0:
            return out
        # Decode layout needs every sequence to add exactly one token (max 1 and sum
        # num_seqs); then row i of q is sequence i, and rows past num_seqs are padding
        # left unwritten, as in the reference.
        if meta.is_pure_decode and sum(meta.query_lens_cpu) == num_seqs:
            decode_attention(
                q[:num_seqs],
                kv_cache,
                meta.block_tables,
                meta.seq_lens,
                scale,
                meta.max_seq_len,
                out=out[:num_seqs],
                window=window,
                softcap=softcap,
            )
        else:
            prefill_attention(
                q,
                kv_cache,
                meta.block_tables,
                meta.query_start_loc,
                meta.seq_lens,
                scale,
                meta.max_query_len,
                out=out,
                window=window,
                softcap=softcap,
            )
        return out
