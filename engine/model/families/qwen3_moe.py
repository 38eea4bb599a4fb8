"""Qwen3-MoE: Qwen3's attention (q/k norms) with a sparse feed-forward (128 experts,
top 8, in the released sizes); layers in `mlp_only_layers`, or off the
`decoder_sparse_step`, keep a dense MLP. llama.cpp's `qwen3moe` files have every
layer sparse and renormalize the top-k weights."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from engine.config import ModelArchitecture
from engine.model.families.base import (
    MOE_GGUF_BLOCKS,
    Family,
    moe_gguf_traits,
    split_fused_experts,
    split_gguf_experts,
)
from engine.model.families.qwen3 import FAMILY as QWEN3
from engine.model.families.qwen3 import qwen3_traits


def qwen3_moe_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3's traits plus the experts' shape and which layers stay dense."""
    layers = int(config["num_hidden_layers"])
    step = int(config.get("decoder_sparse_step") or 1)
    dense_only = {int(i) for i in config.get("mlp_only_layers") or []}
    experts = config.get("num_experts") or config.get("num_local_experts")
    return {
        **qwen3_traits(config),
        "num_experts": int(experts) if experts is not None else 0,
        "num_experts_per_tok": int(config["num_experts_per_tok"]),
        "moe_intermediate_size": int(config["moe_intermediate_size"]),
        "moe_renormalize": bool(config.get("norm_topk_prob", False)),
        "dense_layers": tuple(i for i in range(layers) if i in dense_only or (i + 1) % step != 0),
    }


def qwen3_moe_weights(
    name: str, tensor: torch.Tensor, arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names are the decoder's; transformers 5's fused experts are split."""
    yield from split_fused_experts(name, tensor)


FAMILY = Family(
    name="qwen3_moe",
    title="Qwen3-MoE",
    hf_architectures=("Qwen3MoeForCausalLM",),
    traits=qwen3_moe_traits,
    hf_weights=qwen3_moe_weights,
    gguf_architectures=("qwen3moe",),
    gguf_block_names={**QWEN3.gguf_block_names, **MOE_GGUF_BLOCKS},
    gguf_traits=moe_gguf_traits,
    gguf_weights=split_gguf_experts,
    notes="experts grouped on the CPU, a triton grouped GEMM on CUDA; no LoRA",
)
