"""Mistral and Ministral: Llama's shape, with a sliding window on some releases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, window_of


def mistral_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """No biases; `sliding_window` when the release sets one (v0.1: 4096)."""
    return window_of(config)


FAMILY = Family(
    name="mistral",
    title="Mistral / Ministral",
    hf_architectures=("MistralForCausalLM",),
    # llama.cpp's converter writes Mistral checkpoints as "llama" files.
    gguf_architectures=(),
    traits=mistral_traits,
    notes="sliding-window attention on the layers that have it",
)
