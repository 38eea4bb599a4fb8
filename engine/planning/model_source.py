"""A model's shape, family and storage type from a GGUF file, a Hugging Face folder or
a config.json, without loading its weights."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.checkpoint_quantization import checkpoint_scheme
from engine.model.gguf_loader import open_gguf, read_architecture
from engine.model.hf_loader import architecture_from_config, read_config, safetensors_files


def read_model_architecture(path: str | Path) -> ModelArchitecture:
    """The architecture of the model at `path` (a .gguf, a folder, or its config.json)."""
    path = Path(path)
    if path.is_dir():
        return architecture_from_config(read_config(path))
    if not path.is_file():
        raise UnsupportedModelError(f"{path} is neither a model file nor a folder")
    if path.suffix == ".gguf":
        return read_architecture(open_gguf(str(path)))
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"cannot read {path} as a config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise UnsupportedModelError(f"{path} is not a config.json object")
    return architecture_from_config(config)


@dataclass(frozen=True)
class ModelFacts:
    """What an operator asks of a model file before serving it."""

    family: str  # engine.model.registry's name for it
    quantization: str  # how its matrices are stored: "Q4_K+Q6_K", "BF16", "gptq", ...
    sliding_window: int | None
    window_layers: int  # how many layers use the window (0 without one)
    experts: tuple[int, int] | None = None  # (experts, per token) of an MoE model
    num_layers: int = 0

    @property
    def window_frees_blocks(self) -> bool:
        """Every layer has the window, so blocks behind it are given back as a sequence
        moves on (engine.kv_cache.manager.KVCacheManager.release_behind_window)."""
        return self.sliding_window is not None and self.window_layers == self.num_layers


def read_model_facts(path: str | Path) -> ModelFacts:
    """The family, storage type and window of the model at `path` (a .gguf or a folder)."""
    path = Path(path)
    arch = read_model_architecture(path)
    return ModelFacts(
        family=arch.architecture,
        quantization=_quantization(path),
        sliding_window=arch.sliding_window,
        window_layers=sum(arch.layer_window(i) is not None for i in range(arch.num_layers)),
        experts=(arch.num_experts, arch.num_experts_per_tok) if arch.num_experts else None,
        num_layers=arch.num_layers,
    )


def _quantization(path: Path) -> str:
    """GGUF: its matrices' tensor types, the most used first; a folder: the declared
    quantization method, else the dtype its weights are stored in."""
    if path.is_file() and path.suffix == ".gguf":
        reader = open_gguf(str(path))
        counts = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
        return "+".join(name for name, _ in counts.most_common()) or "none"
    if not path.is_dir():
        return "unknown"
    scheme = checkpoint_scheme(read_config(path))
    if scheme is not None:
        return scheme.label
    with safe_open(str(safetensors_files(path)[0]), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if name.endswith(".weight"):
                return str(f.get_slice(name).get_dtype())
    return "unknown"
