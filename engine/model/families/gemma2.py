"""Gemma 2: Gemma 3's decoder (GeGLU, sandwich norms, 1 + w RMSNorm weights, scaled
embeddings, `query_pre_attn_scalar`, final logit soft-capping) without q/k norms, with
one rotary base for every layer, a sliding window on every other layer (the even ones)
and its attention scores soft-capped: s = cap * tanh(s / cap) (50 in the released
models) before the mask and the softmax, in every attention backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.model.families.base import Family, GgufField, window_of
from engine.model.families.gemma3 import (
    GEMMA_GGUF_BLOCKS,
    gemma_gguf_traits,
    gemma_traits,
    gemma_weights,
)

# llama.cpp's defaults for what a Gemma 2 file leaves out (its hparams for the arch).
_GGUF_WINDOW = 4096
_GGUF_ATTENTION_SOFTCAP = 50.0
_GGUF_FINAL_SOFTCAP = 30.0


def _window_layers(layers: int) -> list[str]:
    """Gemma 2's pattern: layer i has the window when i is even (transformers 4 and
    llama.cpp say it so; transformers 5 writes it out as `layer_types`)."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def gemma2_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 2's parts from a transformers config of either version (the rotary
    settings are the generic ones: a single base for every layer)."""
    kinds = config.get("layer_types") or _window_layers(int(config["num_hidden_layers"]))
    return {**gemma_traits(config), **window_of({**config, "layer_types": kinds})}


def gemma2_gguf_traits(field: GgufField, layers: int) -> dict[str, Any]:
    """Gemma 2's parts from a llama.cpp file; where it leaves out the window or the caps,
    llama.cpp's defaults for the architecture apply (4096, 50 and 30), and the 27B
    (46 layers) gets its attention scale."""
    window = field("attention.sliding_window", None) or _GGUF_WINDOW
    kinds = _window_layers(layers)
    return {
        **gemma_gguf_traits(field, layers, big_layers=46),
        "sliding_window": int(window),
        "full_attention_layers": tuple(i for i, k in enumerate(kinds) if k == "full_attention"),
        "attention_softcap": float(
            field("attn_logit_softcapping", None) or _GGUF_ATTENTION_SOFTCAP
        ),
        "final_logit_softcap": float(field("final_logit_softcapping", None) or _GGUF_FINAL_SOFTCAP),
    }


FAMILY = Family(
    name="gemma2",
    title="Gemma 2",
    hf_architectures=("Gemma2ForCausalLM",),
    gguf_architectures=("gemma2",),
    traits=gemma2_traits,
    hf_weights=gemma_weights,
    gguf_traits=gemma2_gguf_traits,
    gguf_block_names=GEMMA_GGUF_BLOCKS,
    notes="attention scores soft-capped (50) in every backend; window on alternate layers",
)
