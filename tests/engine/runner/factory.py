"""Tiny random-weight models and engines for the runner tests (no model file, no tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from engine.config import ModelArchitecture
from engine.engine_builder import build_config
from engine.llm_engine import LLMEngine
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import LoadedModel
from engine.model.tokenizer import Tokenizer

VOCAB = 512


def tiny_arch(
    *,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    max_positions: int = 256,
) -> ModelArchitecture:
    """A small Llama shape with a real GQA ratio; rope tables cover `max_positions`."""
    return ModelArchitecture(
        vocab_size=VOCAB,
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )


def tiny_model(
    arch: ModelArchitecture, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    """Seeded random weights (drawn in float32, then cast), eval mode, no grads."""
    generator = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM.empty(arch, dtype=dtype, device="cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * torch.randn(param.shape, generator=generator)
            else:
                fan_in = 1 if "embed_tokens" in name else param.shape[-1]
                value = torch.randn(param.shape, generator=generator) / fan_in**0.5
            param.copy_(value)
    return model


class IdTokenizer:
    """Stand-in tokenizer for token-id prompts: text is the ids, EOS is one fixed id."""

    def __init__(self, eos_token_id: int = 0) -> None:
        self.eos_token_ids = frozenset({eos_token_id})

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Each id as ' <id>' (so detokenization works without a vocabulary)."""
        return "".join(f" {i}" for i in ids)


def tiny_engine(arch: ModelArchitecture, model: LlamaForCausalLM, **options: object) -> LLMEngine:
    """An LLMEngine around an in-memory model, configured by flat options."""
    loaded = LoadedModel(
        model=model,
        arch=arch,
        tokenizer=cast(Tokenizer, IdTokenizer()),
        revision="tiny",
        name="tiny",
    )
    return LLMEngine(build_config(None, **options), loaded, keep_finished=True)
