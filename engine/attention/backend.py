"""The attention backend contract and the flat-batch metadata it reads.

A step's batch is flat: the new tokens of every scheduled sequence are laid end
to end (prefill chunks and single decode tokens alike, no phase split). For
sequence i, its new tokens are rows `query_start_loc[i]:query_start_loc[i+1]`
and its whole context (cached prefix + new tokens) has `seq_lens[i]` tokens.

KV cache layout, one tensor per layer::

    kv_cache[layer]: [2, num_blocks, block_size, num_kv_heads, head_dim]
                      ^ 0 = K, 1 = V

    token t of sequence i lives in block block_tables[i, t // block_size]
    at offset t % block_size; its flat slot is block * block_size + offset.

    seq i:  |<--------- seq_lens[i] -------->|
            | cached prefix  |  new tokens   |
            |<- context_len->|<-query_len--->|
                              rows query_start_loc[i]..query_start_loc[i+1]

The new tokens attend causally to themselves and fully to the prefix; with a sliding
window W (a layer's, from the model), each token sees only the last W positions up to
its own. With a soft cap C (Gemma 2), each score s = q.k * scale becomes C * tanh(s / C)
before the mask and the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything attention needs about one step's flat batch. Tensors live on the device."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]: flat KV slot of each new token
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: cumulative new-token counts
    seq_lens: torch.Tensor  # int32 [num_seqs]: context + new tokens per sequence
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with 0
    max_query_len: int
    max_seq_len: int
    # Host copies, so backends need no device sync to plan their work.
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        """Number of sequences in the batch."""
        return len(self.seq_lens_cpu)

    @property
    def is_pure_decode(self) -> bool:
        """True when every sequence adds exactly one token (the decode fast path)."""
        return self.max_query_len == 1


class AttentionBackend(Protocol):
    """Writes a layer's new K/V into the paged cache, then attends over it.

    Contract: `forward` must first store `k`/`v` at `meta.slot_mapping` (rows whose
    slot is negative are skipped), then return, for each new token, softmax-scaled
    attention over its sequence's cached prefix and the causal part of the new tokens
    (with `window`, over the last `window` positions up to its own only; with
    `softcap`, each scaled score s is replaced by softcap * tanh(s / softcap) first).
    GQA: query head h reads KV head h // (num_heads // num_kv_heads).
    """

    name: str

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Stores the new K/V and returns the attention output for the new tokens."""
        ...
