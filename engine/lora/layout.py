"""Whether a PEFT LoRA adapter fits a base model, from its config and tensor shapes alone.

One check for both sides: the engine applies it when it loads an adapter
(engine/lora/peft.py), the admin API when an adapter is uploaded, from the
safetensors header and the base model's metadata (no weights read). No torch here,
so that the check costs nothing to import.

Refused: anything but plain LoRA (DoRA, trained biases), a rank above `max_lora_rank`,
a non-positive lora_alpha, a tensor that is not a LoRA half of one of the decoder's
projections, a layer the model does not have, a lora_A without its lora_B (or the
reverse), and shapes other than A [r, in_features], B [out_features, r].
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidAdapterError

if TYPE_CHECKING:
    from engine.config import ModelArchitecture

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])(?:\.default)?\.weight$"
)


@dataclass(frozen=True)
class AdapterSettings:
    """The parts of adapter_config.json the forward pass uses."""

    rank: int
    alpha: float
    rslora: bool

    @property
    def scale(self) -> float:
        """What B is multiplied by: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.alpha / math.sqrt(self.rank) if self.rslora else self.alpha / self.rank


@dataclass(frozen=True)
class AdapterLayout:
    """A checked adapter: its settings and, per (layer, module), its lora_A and lora_B keys."""

    settings: AdapterSettings
    modules: dict[tuple[int, str], tuple[str, str]]

    @property
    def target_modules(self) -> tuple[str, ...]:
        """The projections it adapts, in the decoder's order."""
        return tuple(sorted({m for _, m in self.modules}, key=TARGET_MODULES.index))


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


def parse_config(raw: bytes) -> dict[str, Any]:
    """adapter_config.json's bytes as a dict."""
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise InvalidAdapterError(f"{CONFIG_FILE} is not JSON", param="path") from exc
    if not isinstance(config, dict):
        raise InvalidAdapterError(f"{CONFIG_FILE} is not an object", param="path")
    return config


def adapter_settings(config: Mapping[str, Any], max_rank: int) -> AdapterSettings:
    """r, alpha and rslora from adapter_config.json, checked (rank within `max_rank`)."""
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
    if rank > max_rank:
        raise InvalidAdapterError(
            f"adapter rank {rank} exceeds max_lora_rank {max_rank}", param="path"
        )
    return AdapterSettings(rank, float(alpha), bool(config.get("use_rslora", False)))


def check_layout(
    settings: AdapterSettings, shapes: Mapping[str, Sequence[int]], arch: ModelArchitecture
) -> AdapterLayout:
    """Checks every tensor's name and shape against the model `arch`."""
    if arch.num_experts:  # the experts' projections have no LoRA path
        raise InvalidAdapterError(
            f"LoRA adapters are not supported on mixture-of-experts models ({arch.architecture})",
            param="path",
        )
    halves: dict[tuple[int, str, str], str] = {}
    for key in shapes:
        match = _KEY.search(key)
        if match is None:
            raise InvalidAdapterError(f"unexpected tensor {key!r} in the adapter", param="path")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in TARGET_MODULES or not 0 <= layer < arch.num_layers:
            raise InvalidAdapterError(f"tensor {key!r} targets no projection here", param="path")
        halves[(layer, module, half)] = key
    rank = settings.rank
    modules: dict[tuple[int, str], tuple[str, str]] = {}
    for layer, module, half in halves:
        if half != "A":
            continue
        a, b = halves[(layer, module, "A")], halves.get((layer, module, "B"))
        if b is None:
            raise InvalidAdapterError(
                f"layer {layer} {module} has lora_A but no lora_B", param="path"
            )
        a_shape, b_shape = tuple(shapes[a]), tuple(shapes[b])
        fan_in, fan_out = module_shape(arch, module)
        if a_shape != (rank, fan_in) or b_shape != (fan_out, rank):
            raise InvalidAdapterError(
                f"layer {layer} {module}: A {a_shape}, B {b_shape}; expected "
                f"A {(rank, fan_in)}, B {(fan_out, rank)}",
                param="path",
            )
        modules[(layer, module)] = (a, b)
    if len(modules) * 2 != len(halves):
        raise InvalidAdapterError("the adapter has lora_B tensors without lora_A", param="path")
    if not modules:
        raise InvalidAdapterError("the adapter has no LoRA tensors", param="path")
    return AdapterLayout(settings, modules)


def check_adapter(
    config: Mapping[str, Any],
    shapes: Mapping[str, Sequence[int]],
    arch: ModelArchitecture,
    max_rank: int,
) -> AdapterLayout:
    """The whole check: settings, then layout; InvalidAdapterError says what is wrong."""
    return check_layout(adapter_settings(config, max_rank), shapes, arch)
