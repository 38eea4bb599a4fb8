"""Mixtral: Mistral's attention with a sparse feed-forward of 8 experts, top 2.

Its checkpoints name the router `block_sparse_moe.gate` and the experts' matrices
w1 (gate), w3 (up) and w2 (down); they are renamed to the decoder's (HF's Qwen3-MoE
names) at load. Its GGUF files are `llama` files with `llama.expert_count` set and
each layer's experts stacked in one tensor per projection.
"""

from __future__ import annotations

import re
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
    window_of,
)

_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def mixtral_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every layer sparse; the experts are as wide as `intermediate_size`."""
    return {
        **window_of(config),
        "num_experts": int(config["num_local_experts"]),
        "num_experts_per_tok": int(config["num_experts_per_tok"]),
        "moe_intermediate_size": int(config["intermediate_size"]),
        "moe_renormalize": True,
    }


def mixtral_weights(
    name: str, tensor: torch.Tensor, arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """`block_sparse_moe.*` -> `mlp.*`, w1/w3/w2 -> gate_proj/up_proj/down_proj (and
    transformers 5's fused in-memory experts split per expert)."""
    match = _EXPERT.match(name)
    if match:
        prefix, expert, w = match.groups()
        yield f"{prefix}.mlp.experts.{expert}.{_PROJ[w]}.weight", tensor
    else:
        yield from split_fused_experts(
            name.replace(".block_sparse_moe.gate.", ".mlp.gate."), tensor
        )


FAMILY = Family(
    name="mixtral",
    title="Mixtral (mixture of experts)",
    hf_architectures=("MixtralForCausalLM",),
    traits=mixtral_traits,
    hf_weights=mixtral_weights,
    # llama.cpp writes Mixtral as a `llama` file with experts (gguf_loader finds it so).
    gguf_permute_qk=True,
    gguf_block_names=MOE_GGUF_BLOCKS,
    gguf_traits=moe_gguf_traits,
    gguf_weights=split_gguf_experts,
    notes=(
        "experts grouped on the CPU, a triton grouped GEMM on CUDA; no LoRA; "
        "GGUF: llama.cpp's `llama` files with expert_count"
    ),
)
