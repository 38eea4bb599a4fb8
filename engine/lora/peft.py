"""Reads a PEFT LoRA adapter folder into per-layer, per-projection A and B matrices.

A folder holds `adapter_config.json` (r, lora_alpha, target_modules, use_rslora) and
`adapter_model.safetensors` with keys such as
`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` ([r, in]) and
`...lora_B.weight` ([out, r]). The scaling (alpha / r, or alpha / sqrt(r) with
rsLoRA) is folded into B here, so the forward pass is x @ A.T @ B.T.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors

from engine.config import ModelArchitecture
from engine.errors import InvalidAdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])(?:\.default)?\.weight$"
)


@dataclass(frozen=True)
class AdapterInfo:
    """What the engine knows about a loaded adapter; `digest` identifies its content."""

    name: str
    rank: int
    alpha: float
    digest: str  # sha256 hex of the safetensors bytes, then the config bytes
    target_modules: tuple[str, ...]
    # Where its weights are now: "device" (in an adapter slot), "host" (in the host
    # LRU, `max_cpu_loras`), "disk" (read again from its folder when next used); None
    # where the engine does not say.
    location: str | None = None


@dataclass(frozen=True)
class AdapterWeights:
    """An adapter's matrices: (layer, module) -> (A [r, in], scaled B [out, r]), on the host."""

    info: AdapterInfo
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        """Host memory the matrices take."""
        return sum(a.nbytes + b.nbytes for a, b in self.modules.values())


def module_shape(arch: ModelArchitecture, module: str) -> tuple[int, int]:
    """(in_features, out_features) of one of the decoder's projections."""
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = {
        "q_proj": (arch.hidden_size, q),
        "k_proj": (arch.hidden_size, kv),
        "v_proj": (arch.hidden_size, kv),
        "o_proj": (q, arch.hidden_size),
        "gate_proj": (arch.hidden_size, arch.intermediate_size),
        "up_proj": (arch.hidden_size, arch.intermediate_size),
        "down_proj": (arch.intermediate_size, arch.hidden_size),
    }
    return shapes[module]


def read_peft_adapter(
    name: str, path: str | Path, arch: ModelArchitecture, max_rank: int
) -> AdapterWeights:
    """Loads and checks an adapter for this model; InvalidAdapterError says what is wrong."""
    folder = Path(path)
    try:
        config_bytes = (folder / CONFIG_FILE).read_bytes()
        weight_bytes = (folder / WEIGHTS_FILE).read_bytes()
    except OSError as exc:
        raise InvalidAdapterError(
            f"adapter folder {str(folder)!r} lacks {CONFIG_FILE} or {WEIGHTS_FILE}", param="path"
        ) from exc
    config = _parse_config(config_bytes)
    rank, alpha = config["r"], config["alpha"]
    if rank > max_rank:
        raise InvalidAdapterError(
            f"adapter rank {rank} exceeds max_lora_rank {max_rank}", param="path"
        )
    scale = alpha / math.sqrt(rank) if config["rslora"] else alpha / rank
    try:
        tensors = load_safetensors(weight_bytes)
    except Exception as exc:  # safetensors raises its own error types
        raise InvalidAdapterError(f"unreadable {WEIGHTS_FILE}: {exc}", param="path") from exc
    halves: dict[tuple[int, str, str], torch.Tensor] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise InvalidAdapterError(f"unexpected tensor {key!r} in the adapter", param="path")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in TARGET_MODULES or not 0 <= layer < arch.num_layers:
            raise InvalidAdapterError(f"tensor {key!r} targets no projection here", param="path")
        weight = tensor.float()
        if not bool(weight.isfinite().all()):
            # A NaN or infinite weight makes only NaN (see engine/lora/batch.py): refused.
            raise InvalidAdapterError(
                f"tensor {key!r} has non-finite values (NaN or infinity)", param="path"
            )
        halves[(layer, module, half)] = weight
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for layer, module, half in halves:
        if half != "A":
            continue
        a, b = halves[(layer, module, "A")], halves.get((layer, module, "B"))
        if b is None:
            raise InvalidAdapterError(f"layer {layer} {module} has lora_A but no lora_B")
        fan_in, fan_out = module_shape(arch, module)
        if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
            raise InvalidAdapterError(
                f"layer {layer} {module}: A {tuple(a.shape)}, B {tuple(b.shape)}; expected "
                f"A {(rank, fan_in)}, B {(fan_out, rank)}",
                param="path",
            )
        scaled = (b * scale).contiguous()
        if not bool(scaled.isfinite().all()):
            raise InvalidAdapterError(
                f"layer {layer} {module}: lora_B times the scaling {scale:g} overflows",
                param="path",
            )
        modules[(layer, module)] = (a.contiguous(), scaled)
    if len(modules) * 2 != len(halves):
        raise InvalidAdapterError("the adapter has lora_B tensors without lora_A", param="path")
    if not modules:
        raise InvalidAdapterError("the adapter has no LoRA tensors", param="path")
    digest = content_digest(weight_bytes, config_bytes)
    targets = tuple(sorted({m for _, m in modules}, key=TARGET_MODULES.index))
    info = AdapterInfo(name, rank, float(alpha), digest, targets)
    return AdapterWeights(info, modules)


def content_digest(weight_bytes: bytes, config_bytes: bytes) -> str:
    """An adapter's `digest`: sha256 hex of its safetensors bytes, then its config bytes."""
    return hashlib.sha256(weight_bytes + config_bytes).hexdigest()


def _parse_config(raw: bytes) -> dict[str, Any]:
    """r, alpha and rslora from adapter_config.json, checked."""
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise InvalidAdapterError(f"{CONFIG_FILE} is not JSON", param="path") from exc
    if not isinstance(config, dict):
        raise InvalidAdapterError(f"{CONFIG_FILE} is not an object", param="path")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA" or config.get("use_dora"):
        raise InvalidAdapterError(f"only plain LoRA adapters run here, not {peft_type}")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidAdapterError(f"{CONFIG_FILE}: r must be a positive integer", param="path")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0:
        raise InvalidAdapterError(f"{CONFIG_FILE}: lora_alpha must be positive", param="path")
    if config.get("bias", "none") != "none":
        raise InvalidAdapterError("adapters with trained biases are not supported", param="path")
    return {"r": rank, "alpha": alpha, "rslora": bool(config.get("use_rslora", False))}
