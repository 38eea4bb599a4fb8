"""A model's shape from a GGUF file, a Hugging Face folder or a config.json,
without loading its weights."""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGUFReader

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.gguf_loader import read_architecture
from engine.model.hf_loader import architecture_from_config, read_config


def read_model_architecture(path: str | Path) -> ModelArchitecture:
    """The architecture of the model at `path` (a .gguf, a folder, or its config.json)."""
    path = Path(path)
    if path.is_dir():
        return architecture_from_config(read_config(path))
    if not path.is_file():
        raise UnsupportedModelError(f"{path} is neither a model file nor a folder")
    if path.suffix == ".gguf":
        try:
            reader = GGUFReader(str(path))
        except (OSError, ValueError) as exc:
            raise UnsupportedModelError(f"cannot read {path} as GGUF: {exc}") from exc
        return read_architecture(reader)
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"cannot read {path} as a config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise UnsupportedModelError(f"{path} is not a config.json object")
    return architecture_from_config(config)
