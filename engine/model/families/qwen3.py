"""Qwen3 dense: an RMSNorm over each head of q and k before rotary, no q/k/v biases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import QK_NORM_GGUF_BLOCKS, Family, window_of


def qwen3_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3's attention_bias (off in every release) covers q, k, v and o."""
    bias = bool(config.get("attention_bias", False))
    return {
        "attention_bias": bias,
        "output_bias": bias,
        "qk_norm": True,
        **window_of(config),
    }


FAMILY = Family(
    name="qwen3",
    title="Qwen3 (dense)",
    hf_architectures=("Qwen3ForCausalLM",),
    gguf_architectures=("qwen3",),
    traits=qwen3_traits,
    gguf_block_names=QK_NORM_GGUF_BLOCKS,
    notes="per-head q/k RMSNorm; <think> comes back as reasoning_content",
)
