"""Reads a PEFT LoRA adapter folder into per-layer, per-projection A and B matrices.

A folder holds `adapter_config.json` (r, lora_alpha, target_modules, use_rslora) and
`adapter_model.safetensors` with keys such as
`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` ([r, in]) and
`...lora_B.weight` ([out, r]). The scaling (alpha / r, or alpha / sqrt(r) with
rsLoRA) is folded into B here, so the forward pass is x @ A.T @ B.T.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from engine.config import ModelArchitecture
from engine.errors import InvalidAdapterError
from engine.lora.layout import (
    CONFIG_FILE,
    TARGET_MODULES,
    WEIGHTS_FILE,
    adapter_settings,
    check_layout,
    module_shape,
    parse_config,
)

__all__ = [
    "CONFIG_FILE",
    "TARGET_MODULES",
    "WEIGHTS_FILE",
    "AdapterInfo",
    "AdapterWeights",
    "content_digest",
    "module_shape",
    "read_peft_adapter",
]


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
    # where the engine does not say. Not part of equality: it is where one adapter's
    # weights happen to be, and it moves with every step that uses them.
    location: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class AdapterWeights:
    """An adapter's matrices: (layer, module) -> (A [r, in], scaled B [out, r]), on the host."""

    info: AdapterInfo
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        """Host memory the matrices take."""
        return sum(a.nbytes + b.nbytes for a, b in self.modules.values())


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
    # The same checks as an upload's (engine/lora/layout.py); the rank's before any
    # weight is read.
    settings = adapter_settings(parse_config(config_bytes), max_rank)
    try:
        tensors = load_safetensors(weight_bytes)
    except Exception as exc:  # safetensors raises its own error types
        raise InvalidAdapterError(f"unreadable {WEIGHTS_FILE}: {exc}", param="path") from exc
    layout = check_layout(settings, {k: tuple(t.shape) for k, t in tensors.items()}, arch)
    scale = settings.scale
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), (a_key, b_key) in layout.modules.items():
        a, b = tensors[a_key].float(), tensors[b_key].float()
        for key, weight in ((a_key, a), (b_key, b)):
            if not bool(weight.isfinite().all()):
                # A NaN or infinite weight makes only NaN (see engine/lora/batch.py): refused.
                raise InvalidAdapterError(
                    f"tensor {key!r} has non-finite values (NaN or infinity)", param="path"
                )
        scaled = (b * scale).contiguous()
        if not bool(scaled.isfinite().all()):
            raise InvalidAdapterError(
                f"layer {layer} {module}: lora_B times the scaling {scale:g} overflows",
                param="path",
            )
        modules[(layer, module)] = (a.contiguous(), scaled)
    digest = content_digest(weight_bytes, config_bytes)
    info = AdapterInfo(name, settings.rank, settings.alpha, digest, layout.target_modules)
    return AdapterWeights(info, modules)


def content_digest(weight_bytes: bytes, config_bytes: bytes) -> str:
    """An adapter's `digest`: sha256 hex of its safetensors bytes, then its config bytes."""
    return hashlib.sha256(weight_bytes + config_bytes).hexdigest()
