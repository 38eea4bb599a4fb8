"""Validates an uploaded PEFT LoRA adapter (a zip of its folder) against its base model.

Checked before anything is registered: the archive is safe to unpack (no path
escapes, bounded size), adapter_config.json names the base model and a rank,
and every lora_A / lora_B tensor in adapter_model.safetensors has the shape the
base model's projection needs: A is [r, in_features], B is [out_features, r].
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from safetensors.numpy import load as load_safetensors

from admin.errors import AdapterValidationError

MAX_UNPACKED_BYTES = 2 * 1024**3
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"


@dataclass(frozen=True)
class BaseDims:
    """The projection sizes of a Llama-family base model."""

    hidden: int
    intermediate: int
    q_out: int
    kv_out: int

    def in_out(self, module: str) -> tuple[int, int] | None:
        """(in_features, out_features) of a projection, or None if not a LoRA target we know."""
        table = {
            "q_proj": (self.hidden, self.q_out),
            "k_proj": (self.hidden, self.kv_out),
            "v_proj": (self.hidden, self.kv_out),
            "o_proj": (self.q_out, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        return table.get(module)


def dims_from_hf_config(config: dict[str, Any]) -> BaseDims:
    """BaseDims from a transformers config.json."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    return BaseDims(hidden, int(config["intermediate_size"]), heads * head_dim, kv * head_dim)


def dims_from_source(source: str) -> BaseDims:
    """BaseDims of a registered model's source: an HF folder or a GGUF file."""
    try:
        return _dims_from_source(source)
    except (OSError, KeyError, ValueError, IndexError) as exc:
        raise AdapterValidationError(f"cannot read the base model's shapes from {source}") from exc


def _dims_from_source(source: str) -> BaseDims:
    path = Path(source)
    if path.is_dir():
        return dims_from_hf_config(json.loads((path / "config.json").read_text()))
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")

    def field(name: str) -> int:
        return int(reader.fields[f"{arch}.{name}"].parts[-1][0])

    hidden = field("embedding_length")
    heads = field("attention.head_count")
    kv = field("attention.head_count_kv")
    return BaseDims(hidden, field("feed_forward_length"), hidden, kv * (hidden // heads))


@dataclass(frozen=True)
class ValidatedAdapter:
    """What the archive declared, after every check passed."""

    base_model: str
    rank: int
    target_modules: tuple[str, ...]
    files: dict[str, bytes]


def _module_of(tensor: str) -> tuple[str, str] | None:
    # e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
    parts = tensor.split(".")
    for i, part in enumerate(parts):
        if part in ("lora_A", "lora_B") and i > 0:
            return parts[i - 1], part
    return None


def read_archive(data: bytes) -> dict[str, bytes]:
    """The archive's files by base name (a folder inside the zip is allowed); safety-checked."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise AdapterValidationError("not a zip archive") from exc
    total = 0
    files: dict[str, bytes] = {}
    for info in archive.infolist():
        if info.is_dir():
            continue
        name = PurePosixPath(info.filename)
        if name.is_absolute() or ".." in name.parts:
            raise AdapterValidationError(f"unsafe path in archive: {info.filename}")
        total += info.file_size
        if total > MAX_UNPACKED_BYTES:
            raise AdapterValidationError("archive too large when unpacked")
        files[name.name] = archive.read(info)
    return files


def validate_adapter(
    data: bytes, *, base_model: str, base_aliases: set[str], dims: BaseDims
) -> ValidatedAdapter:
    """Checks an uploaded zip; raises AdapterValidationError naming the first problem."""
    files = read_archive(data)
    if CONFIG_NAME not in files or WEIGHTS_NAME not in files:
        raise AdapterValidationError(f"the archive needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        config = json.loads(files[CONFIG_NAME])
        rank = int(config["r"])
        declared = str(config.get("base_model_name_or_path") or "")
    except (ValueError, KeyError, TypeError) as exc:
        raise AdapterValidationError("adapter_config.json is malformed or lacks r") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterValidationError("only LoRA adapters are supported")
    if declared not in base_aliases:
        raise AdapterValidationError(f"adapter was trained for {declared!r}, not {base_model!r}")
    if rank <= 0:
        raise AdapterValidationError("rank must be positive")
    targets: set[str] = set()
    try:
        tensors = load_safetensors(files[WEIGHTS_NAME])
    except Exception as exc:
        raise AdapterValidationError(f"{WEIGHTS_NAME} is not a readable safetensors file") from exc
    for name, tensor in tensors.items():
        found = _module_of(name)
        if found is None:
            continue
        module, which = found
        io_dims = dims.in_out(module)
        if io_dims is None:
            raise AdapterValidationError(f"unknown LoRA target module {module!r}")
        want = (rank, io_dims[0]) if which == "lora_A" else (io_dims[1], rank)
        if tuple(tensor.shape) != want:
            raise AdapterValidationError(f"{name} has shape {tuple(tensor.shape)}, expected {want}")
        targets.add(module)
    if not targets:
        raise AdapterValidationError("no lora_A/lora_B tensors found")
    return ValidatedAdapter(base_model, rank, tuple(sorted(targets)), files)


def store_adapter(validated: ValidatedAdapter, folder: Path) -> Path:
    """Writes the validated files into `folder` (created); returns it."""
    folder.mkdir(parents=True, exist_ok=False)
    for name, content in validated.files.items():
        (folder / name).write_bytes(content)
    return folder
