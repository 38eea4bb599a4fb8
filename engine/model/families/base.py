"""What a model family is to the engine: how its checkpoints name and shape things.

Every family runs on the same decoder (engine/model/llama.py); a family says which
of its small, named parts it uses (biases, q/k norms, a window) and how its
checkpoints differ from Hugging Face's Llama layout (fused projections, GGUF names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError

# Weight name, tensor -> the (name, tensor) pairs our decoder's parameters take.
WeightMapper = Callable[[str, torch.Tensor, ModelArchitecture], Iterator[tuple[str, torch.Tensor]]]


def same_weight(
    name: str, tensor: torch.Tensor, arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """The default mapper: the checkpoint already names weights as the decoder does."""
    yield name, tensor


def no_traits(config: Mapping[str, Any]) -> dict[str, Any]:
    """The default: nothing beyond the Llama shape."""
    return {}


# A GGUF metadata reader: `{arch}.<key>`'s value, or the default.
GgufField = Callable[[str, Any], Any]


def no_gguf_traits(field: GgufField, layers: int) -> dict[str, Any]:
    """The default: what the generic GGUF reader finds is the whole shape."""
    return {}


@dataclass(frozen=True)
class Family:
    """One model family: its names in each format and the parts of the decoder it uses.

    `traits` reads a Hugging Face config.json into the family's own ModelArchitecture
    fields (attention_bias, output_bias, qk_norm, sliding_window); `hf_weights` maps
    its checkpoint's tensors onto the decoder's; `gguf_*` do the same for llama.cpp's
    files.
    """

    name: str
    title: str
    hf_architectures: tuple[str, ...]
    gguf_architectures: tuple[str, ...] = ()
    traits: Callable[[Mapping[str, Any]], dict[str, Any]] = no_traits
    hf_weights: WeightMapper = same_weight
    # llama.cpp reorders Q/K rows for its interleaved rotary in these files only.
    gguf_permute_qk: bool = False
    # Extra llama.cpp block tensor names -> ours (beyond the Llama set, or instead).
    gguf_block_names: Mapping[str, str] = field(default_factory=dict)
    # The family's own fields from GGUF metadata (on top of the generic reading).
    gguf_traits: Callable[[GgufField, int], dict[str, Any]] = no_gguf_traits
    # Renamed GGUF tensors -> the decoder's (fused ones split, as for its HF files).
    gguf_weights: WeightMapper = same_weight
    notes: str = ""

    def describe(self) -> dict[str, Any]:
        """The family as plain data (`cloister models families --json`)."""
        return {
            "family": self.name,
            "title": self.title,
            "hf_architectures": list(self.hf_architectures),
            "gguf_architectures": list(self.gguf_architectures),
            "notes": self.notes,
        }


def window_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The sliding window a config turns on and the layers without it, as
    ModelArchitecture fields (`sliding_window` None: no window anywhere).

    transformers 5 lists each layer's kind in `layer_types`; older configs say it with
    `max_window_layers` (Qwen: layers from there on use the window). Qwen configs carry
    a `sliding_window` they do not use unless `use_sliding_window` is true; Mistral and
    Phi-3 use theirs on every layer whenever it is set.
    """
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False or window is None:
        return {"sliding_window": None}
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UnsupportedModelError(f"sliding_window must be a positive integer, not {window!r}")
    layers = int(config["num_hidden_layers"])
    kinds = config.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise UnsupportedModelError(f"layer_types must list the {layers} layers' kinds")
        full = tuple(i for i, kind in enumerate(kinds) if kind != "sliding_attention")
    elif config.get("use_sliding_window"):
        full = tuple(range(min(layers, int(config.get("max_window_layers") or 0))))
    else:
        full = ()
    return {"sliding_window": window, "full_attention_layers": full}


def refuse_mlp_bias(config: Mapping[str, Any]) -> None:
    """The decoder's MLP has no biases; a config that asks for them is refused by name."""
    if config.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported (the MLP has no biases)")


def split_fused_experts(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """transformers 5's in-memory expert layout, `mlp.experts.gate_up_proj` [E, 2I, H]
    (gate rows, then up) and `mlp.experts.down_proj` [E, H, I], as one tensor per expert
    under the names a checkpoint uses; any other tensor passes through."""
    if name.endswith(".mlp.experts.gate_up_proj") and tensor.dim() == 3:
        prefix = name.removesuffix("gate_up_proj")
        for e, (gate, up) in enumerate(t.chunk(2) for t in tensor):
            yield f"{prefix}{e}.gate_proj.weight", gate
            yield f"{prefix}{e}.up_proj.weight", up
    elif name.endswith(".mlp.experts.down_proj") and tensor.dim() == 3:
        prefix = name.removesuffix("down_proj")
        for e, down in enumerate(tensor):
            yield f"{prefix}{e}.down_proj.weight", down
    else:
        yield name, tensor


# llama.cpp's names for the per-head q and k RMSNorms (Qwen3, Gemma 3).
QK_NORM_GGUF_BLOCKS: Mapping[str, str] = {
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}

# llama.cpp's names for a sparse layer's router and its experts stacked in one 3-D
# tensor each ([experts, rows, cols] once read), renamed so `split_gguf_experts` finds them.
MOE_GGUF_BLOCKS: Mapping[str, str] = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_stack",
    "ffn_up_exps": "mlp.experts.up_stack",
    "ffn_down_exps": "mlp.experts.down_stack",
}
_STACKS = {"gate_stack": "gate_proj", "up_stack": "up_proj", "down_stack": "down_proj"}


def split_gguf_experts(
    name: str, tensor: torch.Tensor, arch: ModelArchitecture
) -> Iterator[tuple[str, torch.Tensor]]:
    """A GGUF file's stacked experts as one tensor per expert, under the names the
    decoder's experts take; the stack must hold `num_experts` of them."""
    prefix, _, stack = name.removesuffix(".weight").rpartition(".")
    if stack not in _STACKS or not prefix.endswith(".mlp.experts"):
        yield name, tensor
        return
    if tensor.dim() != 3 or tensor.shape[0] != arch.num_experts:
        raise UnsupportedModelError(
            f"GGUF expert stack for {name!r} has shape {list(tensor.shape)}, "
            f"expected [{arch.num_experts}, rows, cols]"
        )
    for expert, weight in enumerate(tensor):
        yield f"{prefix}.{expert}.{_STACKS[stack]}.weight", weight


def moe_gguf_traits(field: GgufField, layers: int) -> dict[str, Any]:
    """The experts' count, top-k and width from llama.cpp's metadata; every layer is
    sparse and the top-k weights renormalized, as llama.cpp runs these files."""
    count, used = field("expert_count", None), field("expert_used_count", None)
    if not count or not used:
        raise UnsupportedModelError("GGUF metadata lacks expert_count or expert_used_count")
    width = field("expert_feed_forward_length", None) or field("feed_forward_length", None)
    return {
        "num_experts": int(count),
        "num_experts_per_tok": int(used),
        "moe_intermediate_size": int(width),
        "moe_renormalize": bool(field("expert_weights_norm", True)),
    }
