"""Load a model from a Hugging Face folder (config.json + safetensors).

The family (engine.model.registry) comes from config.json's `architectures`. Most
families' parameter names match ours, so weights stream straight from the (possibly
sharded) safetensors files into the model; the rest are mapped by their family.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.checkpoint_quantization import checkpoint_scheme
from engine.model.families.base import Family
from engine.model.llama import LlamaForCausalLM
from engine.model.registry import family_named, family_of_config
from engine.model.rope import rope_settings

INDEX_FILE = "model.safetensors.index.json"
log = logging.getLogger("engine.model")


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's config.json as a dict."""
    path = Path(folder) / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"cannot read {path}: {exc}") from exc
    return config


def architecture_from_config(config: Mapping[str, Any]) -> ModelArchitecture:
    """Maps a transformers config (v4 or v5 spelling of rope settings) onto ModelArchitecture.

    A missing or ill-typed field is refused by name (UnsupportedModelError).
    """
    family = family_of_config(config)
    checkpoint_scheme(config)  # refuses an unsupported quantization by name
    try:
        return _architecture(config, family)
    except KeyError as exc:
        raise UnsupportedModelError(f"config.json lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"config.json has a bad value: {exc}") from None


def _architecture(config: Mapping[str, Any], family: Family) -> ModelArchitecture:
    hidden = int(config["hidden_size"])
    num_heads = int(config["num_attention_heads"])
    theta, scaling = rope_settings(config)
    fields: dict[str, Any] = dict(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        rope_scaling=scaling,
        architecture=family.name,
    )
    # A family's traits come last: they may override the generic reading (Gemma 3's
    # rotary settings per layer kind).
    return ModelArchitecture(**{**fields, **family.traits(config)})


def safetensors_files(folder: str | Path) -> list[Path]:
    """The weight files: those named by the shard index, else every *.safetensors."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"no *.safetensors weights in {folder}")
    return files


def iter_weights(
    folder: str | Path, *, progress: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) from every safetensors file of the folder."""
    files = safetensors_files(folder)
    with tqdm(desc="loading weights", unit="tensor", disable=not progress) as bar:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    yield name, f.get_tensor(name)
                    bar.update()


def load_hf_model(
    folder: str | Path,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    progress: bool = False,
) -> tuple[LlamaForCausalLM, ModelArchitecture]:
    """Reads config.json and the safetensors weights into a ready, eval-mode model
    (a quantized checkpoint dequantized on the way: engine/model/checkpoint_quantization.py)."""
    config = read_config(folder)
    arch = architecture_from_config(config)
    model = LlamaForCausalLM.empty(arch, dtype=dtype, device=device)
    mapper = family_named(arch.architecture).hf_weights
    weights: Iterable[tuple[str, torch.Tensor]] = iter_weights(folder, progress=progress)
    scheme = checkpoint_scheme(config)
    if scheme is not None:
        if torch.device(device).type == "cuda":
            # No packed GEMM kernel here yet: the GPU holds the weights unpacked.
            log.warning(
                "%s weights are dequantized to %s at load (no packed kernel)", scheme.label, dtype
            )
        weights = scheme.dequantized(weights, safetensors_files(folder))
    model.load_weights(pair for name, tensor in weights for pair in mapper(name, tensor, arch))
    return model, arch
