"""Llama 2/3 and the checkpoints that declare it (SmolLM, TinyLlama, many fine-tunes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, refuse_mlp_bias


def llama_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Llama's `attention_bias` covers q, k, v and o alike."""
    refuse_mlp_bias(config)
    bias = bool(config.get("attention_bias", False))
    return {"attention_bias": bias, "output_bias": bias}


FAMILY = Family(
    name="llama",
    title="Llama (Llama 2/3, SmolLM, TinyLlama)",
    hf_architectures=("LlamaForCausalLM",),
    gguf_architectures=("llama",),
    traits=llama_traits,
    gguf_permute_qk=True,
)
