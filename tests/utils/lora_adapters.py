"""Synthetic PEFT LoRA adapters with known random weights, and merged reference models."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.config import ModelArchitecture
from engine.lora.peft import module_shape
from engine.model.hf_loader import architecture_from_config

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTN = {"q_proj", "k_proj", "v_proj", "o_proj"}


def _prefix(layer: int, module: str) -> str:
    part = "self_attn" if module in _ATTN else "mlp"
    return f"base_model.model.model.layers.{layer}.{part}.{module}"


def make_peft_adapter(
    folder: Path | str,
    model: Path | str | ModelArchitecture,
    rank: int,
    alpha: float,
    targets: Sequence[str] = ALL_TARGETS,
    seed: int = 0,
    *,
    use_rslora: bool = False,
    magnitude: float = 0.5,
) -> Path:
    """Writes a PEFT adapter for `model`; returns the folder.

    `model`: an HF model folder (its config.json), or the architecture of a loaded
    model (a GGUF file has no config.json: the engine's `LoadedModel.arch`).

    A and B are both random (a trained adapter's B is non-zero), sized so the delta
    visibly changes the model's outputs.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(model, ModelArchitecture):
        arch = model
    else:
        arch = architecture_from_config(json.loads((Path(model) / "config.json").read_text()))
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(arch.num_layers):
        for module in targets:
            fan_in, fan_out = module_shape(arch, module)
            a = torch.randn(rank, fan_in, generator=generator) / math.sqrt(fan_in)
            b = magnitude * torch.randn(fan_out, rank, generator=generator) / math.sqrt(rank)
            tensors[f"{_prefix(layer, module)}.lora_A.weight"] = a.contiguous()
            tensors[f"{_prefix(layer, module)}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(targets),
        "use_rslora": use_rslora,
        "bias": "none",
        "base_model_name_or_path": "" if isinstance(model, ModelArchitecture) else str(model),
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return folder


def merge_adapter(model_dir: Path | str, adapter_dir: Path | str, out_dir: Path | str) -> Path:
    """A copy of the model folder with W + scale * B @ A merged into its weights (the reference)."""
    model_dir, adapter_dir, out = Path(model_dir), Path(adapter_dir), Path(out_dir)
    shutil.copytree(model_dir, out)
    state = load_file(str(model_dir / "model.safetensors"))
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    rank, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    lora = load_file(str(adapter_dir / "adapter_model.safetensors"))
    for key, a in lora.items():
        if ".lora_A." not in key:
            continue
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        merged = state[name].double() + scale * (b.double() @ a.double())
        state[name] = merged.float().contiguous()
    save_file(state, str(out / "model.safetensors"))
    return out
