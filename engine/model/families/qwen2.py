"""Qwen2 and Qwen2.5: biases on q, k and v, none on o."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, window_of


def qwen2_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen2 always biases q/k/v; its window is used only with use_sliding_window."""
    return {"attention_bias": True, "output_bias": False, **window_of(config)}


FAMILY = Family(
    name="qwen2",
    title="Qwen2 / Qwen2.5",
    hf_architectures=("Qwen2ForCausalLM",),
    gguf_architectures=("qwen2",),
    traits=qwen2_traits,
)
