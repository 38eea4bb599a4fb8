"""Gemma 3 (text): GeGLU, norms before and after both attention and the MLP, RMSNorm
weights stored as w - 1 (the norm scales by 1 + w), embeddings scaled by
sqrt(hidden), q/k norms, `query_pre_attn_scalar` for the attention scale, and five
sliding-window layers to each global one, the window layers on a rotary base of
their own. `attn_logit_softcapping` is read and ignored, as transformers' Gemma 3 does
(its attention never takes the cap; released configs set it to null).

The parts Gemma 2 shares (engine/model/families/gemma2.py) are read here too:
`gemma_traits`, `gemma_gguf_traits` and `gemma_weights`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.families.base import QK_NORM_GGUF_BLOCKS, Family, GgufField, window_of
from engine.model.rope import rope_settings

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")
# llama.cpp's names for the norms after attention and around the MLP (Gemma 2 and 3).
GEMMA_GGUF_BLOCKS: Mapping[str, str] = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def _cap(value: Any) -> float | None:
    """A soft cap from a config or a file: None (or 0, llama.cpp's "off") is no cap."""
    return float(value) if value else None


def gemma_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """What Gemma 2 and 3 configs share: GeGLU, sandwich norms, scaled embeddings,
    `query_pre_attn_scalar`, and the soft caps on the attention scores and the logits."""
    if config.get("use_bidirectional_attention"):
        raise UnsupportedModelError("bidirectional attention (EmbeddingGemma) is not supported")
    activation = config.get("hidden_activation") or config.get("hidden_act")
    if activation not in _GELU_TANH:
        raise UnsupportedModelError(f"Gemma's MLP activation {activation!r} is not supported")
    return {
        "attention_bias": bool(config.get("attention_bias", False)),
        "output_bias": bool(config.get("attention_bias", False)),
        "sandwich_norms": True,
        "mlp_activation": "gelu_tanh",
        "embedding_multiplier": float(config["hidden_size"]) ** 0.5,
        "attention_scale": float(config.get("query_pre_attn_scalar") or 256) ** -0.5,
        "attention_softcap": _cap(config.get("attn_logit_softcapping")),
        "final_logit_softcap": _cap(config.get("final_logit_softcapping")),
    }


def gemma3_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 3's parts, from transformers 5's config (rope per layer kind, layer_types)
    or an older one (rope_local_base_freq, sliding_window_pattern)."""
    shared = gemma_traits(config)
    layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is None and config.get("sliding_window_pattern"):
        pattern = int(config["sliding_window_pattern"])
        kinds = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(layers)
        ]
    per_kind = config.get("rope_parameters") or {}
    if "full_attention" in per_kind:  # transformers 5: one rope setting per layer kind
        theta, scaling = rope_settings({"rope_parameters": per_kind["full_attention"]})
        local = per_kind.get("sliding_attention") or {}
        local_theta = float(local.get("rope_theta", 10000.0))
    else:
        theta, scaling = rope_settings(config)
        local_theta = float(config.get("rope_local_base_freq", 10000.0))
    return {
        **shared,
        # transformers' Gemma 3 keeps attn_logit_softcapping in its config but never
        # passes it to the attention: capping here would leave its logits.
        "attention_softcap": None,
        **window_of({**config, "layer_types": kinds}),
        "qk_norm": True,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "local_rope_theta": local_theta,
    }


def gemma_gguf_traits(field: GgufField, layers: int, big_layers: int) -> dict[str, Any]:
    """What llama.cpp's Gemma 2 and 3 files share: norms stored as 1 + w already (so
    no mapping), sandwich norms, scaled embeddings, the final logit cap when the file
    has one, and the attention scale llama.cpp fixes: (hidden / heads) ** -0.5 for the
    27B (`big_layers` layers), head_dim ** -0.5 otherwise."""
    hidden = int(field("embedding_length", 0))
    heads = int(field("attention.head_count", 1))
    return {
        "sandwich_norms": True,
        "mlp_activation": "gelu_tanh",
        "embedding_multiplier": float(hidden) ** 0.5,
        "attention_scale": (hidden / heads) ** -0.5 if layers == big_layers else None,
        "final_logit_softcap": _cap(field("final_logit_softcapping", None)),
    }


def gemma3_gguf_traits(field: GgufField, layers: int) -> dict[str, Any]:
    """Gemma 3's parts from a llama.cpp file; llama.cpp fixes what the file does not
    say: five window layers to each global one, a rotary base of 10000 for the window
    layers, and the 27B's attention scale (62 layers)."""
    window = field("attention.sliding_window", None)
    return {
        **gemma_gguf_traits(field, layers, big_layers=62),
        "sliding_window": int(window) if window else None,
        "full_attention_layers": tuple(i for i in range(layers) if (i + 1) % 6 == 0),
        "qk_norm": True,
        "local_rope_theta": 10000.0,
        # llama.cpp caps the attention scores of Gemma 2 files only.
    }


def gemma_weights(
    name: str, tensor: torch.Tensor, arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """Gemma's norms scale by 1 + w: stored here as the plain weight 1 + w."""
    yield name, tensor + 1.0 if name.endswith("norm.weight") else tensor


FAMILY = Family(
    name="gemma3",
    title="Gemma 3 (text)",
    hf_architectures=("Gemma3ForCausalLM",),
    gguf_architectures=("gemma3",),
    traits=gemma3_traits,
    hf_weights=gemma_weights,
    gguf_traits=gemma3_gguf_traits,
    gguf_block_names={**GEMMA_GGUF_BLOCKS, **QK_NORM_GGUF_BLOCKS},
    notes="5 window layers to 1 global, the window layers on their own rotary base",
)
