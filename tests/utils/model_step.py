"""Run a model standalone in tests: a private KV pool, contiguous block tables, flat steps.

Sequence i owns blocks [i * blocks_per_seq, (i + 1) * blocks_per_seq) of the pool,
so block tables are trivial and no block manager is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import ModelArchitecture
from engine.model.forward_context import ForwardContext
from engine.model.llama import LlamaForCausalLM

# A tiny Llama shape for tests that build a model from random weights.
TINY_ARCH = ModelArchitecture(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)


def allocate_kv_caches(
    arch: ModelArchitecture,
    num_blocks: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> list[torch.Tensor]:
    """One zeroed [2, num_blocks, block_size, kv_heads, head_dim] cache per layer."""
    shape = (2, num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(arch.num_layers)]


def contiguous_metadata(
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    *,
    block_size: int,
    blocks_per_seq: int,
    device: str | torch.device = "cpu",
) -> AttentionMetadata:
    """Metadata for one flat step where sequence i owns a contiguous run of blocks."""
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    slots: list[int] = []
    for i, (ctx_len, seq_len) in enumerate(zip(context_lens, seq_lens, strict=True)):
        base = i * blocks_per_seq * block_size
        slots.extend(base + t for t in range(ctx_len, seq_len))
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    tables = [
        list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(len(query_lens))
    ]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=tuple(query_lens),
        seq_lens_cpu=tuple(seq_lens),
    )


class ModelStepper:
    """Feeds new tokens for a fixed set of sequences and keeps their KV in its own pool."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        *,
        num_seqs: int = 1,
        max_len: int = 64,
        block_size: int = 4,
        backend: AttentionBackend | None = None,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.blocks_per_seq = (max_len + block_size - 1) // block_size
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.kv_caches = allocate_kv_caches(
            model.arch, num_seqs * self.blocks_per_seq, block_size, dtype=dtype, device=self.device
        )
        self.backend = backend or TorchAttentionBackend()
        self.lengths = [0] * num_seqs

    @torch.no_grad()
    def step(self, new_tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Appends new_tokens[i] to sequence i; returns float32 logits for every new token [T, V]."""
        query_lens = [len(toks) for toks in new_tokens]
        meta = contiguous_metadata(
            query_lens,
            self.lengths,
            block_size=self.block_size,
            blocks_per_seq=self.blocks_per_seq,
            device=self.device,
        )
        ids = [t for toks in new_tokens for t in toks]
        positions = [
            p for c, q in zip(self.lengths, query_lens, strict=True) for p in range(c, c + q)
        ]
        ctx = ForwardContext(backend=self.backend, meta=meta, kv_caches=self.kv_caches)
        hidden = self.model(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            ctx,
        )
        self.lengths = [c + q for c, q in zip(self.lengths, query_lens, strict=True)]
        return self.model.compute_logits(hidden)
