"""Phi-3 and Phi-4: q/k/v and gate/up stored fused in the checkpoint.

The fused tensors are split at load into the decoder's q/k/v and gate/up, which it
packs back together itself (so both layouts run the same GEMMs).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.families.base import Family, window_of
from engine.model.rope import PHI3_ORIGINAL_CONTEXT, rope_settings


def phi3_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Phi-3 has no biases; its rotary may be partial (Phi-4-mini) and LongRoPE-scaled
    (the 128k releases, Phi-3.5, Phi-4-mini), read as transformers' Phi3Config does."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    # Phi3Config renames its older LongRoPE spellings ("su", "yarn"): the same factors.
    if rope.get("rope_type", rope.get("type")) in ("su", "yarn"):
        rope = {k: v for k, v in rope.items() if k != "type"} | {"rope_type": "longrope"}
    # Phi3Config reads the pretraining context from its own field (4096 by default)
    # and never from the rope dict.
    original = config.get("original_max_position_embeddings") or PHI3_ORIGINAL_CONTEXT
    phi3 = {
        **config,
        "rope_parameters": rope,
        "rope_scaling": None,
        "original_max_position_embeddings": original,
    }
    _, scaling = rope_settings(phi3)
    # transformers windows every Phi-3 layer when a window is set (no layer_types).
    window = window_of({k: v for k, v in config.items() if k != "layer_types"})
    return {"rope_scaling": scaling, **window}


def phi3_weights(
    name: str, tensor: torch.Tensor, arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """Splits `qkv_proj` into q/k/v and `gate_up_proj` into gate and up."""
    if name.endswith(".self_attn.qkv_proj.weight"):
        prefix = name.removesuffix("qkv_proj.weight")
        q_rows, kv_rows = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        if tensor.shape[0] != q_rows + 2 * kv_rows:
            raise UnsupportedModelError(
                f"weight {name!r} has {tensor.shape[0]} rows, expected {q_rows + 2 * kv_rows}"
            )
        q, k, v = torch.split(tensor, [q_rows, kv_rows, kv_rows])
        yield from ((prefix + "q_proj.weight", q), (prefix + "k_proj.weight", k))
        yield prefix + "v_proj.weight", v
    elif name.endswith(".mlp.gate_up_proj.weight"):
        prefix = name.removesuffix("gate_up_proj.weight")
        gate, up = torch.chunk(tensor, 2)
        yield from ((prefix + "gate_proj.weight", gate), (prefix + "up_proj.weight", up))
    else:
        yield name, tensor


FAMILY = Family(
    name="phi3",
    title="Phi-3 / Phi-4",
    hf_architectures=("Phi3ForCausalLM",),
    gguf_architectures=("phi3",),
    traits=phi3_traits,
    hf_weights=phi3_weights,
    # llama.cpp keeps Phi-3's fused tensors: split at load as the HF ones are.
    gguf_block_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    gguf_weights=phi3_weights,
    notes="LongRoPE (the 128k releases) switches to its long factors per position, "
    "from original_max_position_embeddings on; partial rotary (Phi-4-mini) supported",
)
