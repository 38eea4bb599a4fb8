"""Validates an uploaded PEFT LoRA adapter (a zip of its folder) against its base model.

Checked before anything is registered: the archive is safe to unpack (engine.lora.archive:
entry count, sizes, ratio, paths, member types, encryption, compression method,
all before inflating; then bounded extraction to disk), adapter_config.json is a
small, shallow JSON object naming the base model and an integer rank, then the
engine's own check of an adapter against its base model (engine.lora.layout: plain
LoRA, rank within max_lora_rank, every tensor a lora_A / lora_B pair of a projection
of a layer the model has, A [r, in_features] and B [out_features, r]), on the
safetensors header's shapes and the base model's metadata (config.json or the GGUF
header; no weights read), so that no adapter is stored that the engine then refuses.
Every tensor must hold only finite numbers (a NaN or infinite weight makes its
requests' outputs NaN): the weights' bits are scanned in chunks (no float conversion,
so any float dtype, bf16 included, is read the same way).

Everything here blocks (disk, inflate): callers run it in a worker thread.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import safe_open

from admin.errors import AdapterValidationError
from admin.registry import MAX_RANK
from admin.source_paths import SourcePathError, check_source
from engine.errors import EngineError, InvalidAdapterError
from engine.lora.archive import DEFAULT_LIMITS, AdapterArchiveError, ArchiveLimits, extract_members
from engine.lora.layout import check_adapter

if TYPE_CHECKING:
    from engine.config import ModelArchitecture

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 32
# Float dtypes of safetensors: (the unsigned integer of their width, mask). A value is
# not finite when its bits & mask == mask: every exponent bit set (float8 e4m3 has no
# infinity, and its NaN sets every exponent and mantissa bit).
_FLOAT_BITS: dict[str, tuple[type[np.unsignedinteger[Any]], int]] = {
    "F64": (np.uint64, 0x7FF0_0000_0000_0000),
    "F32": (np.uint32, 0x7F80_0000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F8_E5M2": (np.uint8, 0x7C),
    "F8_E4M3": (np.uint8, 0x7F),
}
_INTEGER_DTYPES = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})
_SCAN_CHUNK = 1 << 20  # values per scanned chunk: bounds the scan's memory


def arch_from_source(source: str, roots: Sequence[Path]) -> ModelArchitecture:
    """The shape of a registered model, read by the engine's own readers from its
    config.json or GGUF header (no weights).

    The source is checked first (a regular file or folder under `roots`): a FIFO or
    device registered earlier must never be opened, since reading it blocks or never ends.
    """
    try:
        path = check_source(source, roots)
    except SourcePathError as exc:
        raise AdapterValidationError(f"the base model's source cannot be read: {exc}") from exc
    try:
        return _arch_from_source(path)
    except EngineError as exc:  # an architecture the engine cannot run, metadata missing
        raise AdapterValidationError(
            f"cannot read the base model's shapes from {source}: {exc}"
        ) from exc
    except (OSError, KeyError, ValueError, IndexError, TypeError, struct.error) as exc:
        raise AdapterValidationError(f"cannot read the base model's shapes from {source}") from exc


def _arch_from_source(path: Path) -> ModelArchitecture:
    # Imported here: the engine's model readers import torch, which an admin process
    # otherwise never needs (this runs in a worker thread, on an upload).
    if path.is_dir():
        from engine.model.hf_loader import architecture_from_config, read_config

        return architecture_from_config(read_config(path))
    from gguf import GGUFReader

    from engine.model.gguf_loader import read_architecture

    return read_architecture(GGUFReader(str(path)))


@dataclass(frozen=True)
class ValidatedAdapter:
    """What the archive declared, after every check passed; its files are in `folder`."""

    base_model: str
    rank: int
    target_modules: tuple[str, ...]
    folder: Path


def _module_of(tensor: str) -> tuple[str, str] | None:
    # e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
    parts = tensor.split(".")
    for i, part in enumerate(parts):
        if part in ("lora_A", "lora_B") and i > 0:
            return parts[i - 1], part
    return None


def _depth(value: Any) -> int:
    # Iterative, so that a deep value cannot exhaust the stack here either.
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_CONFIG_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def read_config(path: Path) -> dict[str, Any]:
    """adapter_config.json as a dict: at most 1 MiB, 32 levels deep, finite numbers only."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterValidationError(f"{CONFIG_NAME} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(path.read_bytes(), parse_constant=_no_constant)
    except RecursionError as exc:
        raise AdapterValidationError(f"{CONFIG_NAME} is nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdapterValidationError(f"{CONFIG_NAME} is not valid JSON") from exc
    if not isinstance(config, dict):
        raise AdapterValidationError(f"{CONFIG_NAME} must be a JSON object")
    if _depth(config) > MAX_CONFIG_DEPTH:
        raise AdapterValidationError(f"{CONFIG_NAME} is nested too deeply")
    return config


def _rank(config: dict[str, Any]) -> int:
    rank = config.get("r")
    # 1e999 parses as inf and 4.0 as a float: only a plain JSON integer is a rank.
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise AdapterValidationError(f"{CONFIG_NAME} needs an integer rank r")
    if not 0 < rank <= MAX_RANK:
        raise AdapterValidationError(f"rank must be between 1 and {MAX_RANK}")
    return rank


def _check_alpha(config: dict[str, Any]) -> None:
    alpha = config.get("lora_alpha", 1)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise AdapterValidationError("lora_alpha must be a number")
    if not math.isfinite(alpha) or not 0 < abs(alpha) <= 1e6:
        raise AdapterValidationError("lora_alpha must be a finite, non-zero number up to 1e6")


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        with safe_open(str(path), framework="np") as weights:
            names = list(weights.keys())
            return {name: tuple(weights.get_slice(name).get_shape()) for name in names}
    except Exception as exc:  # the safetensors reader raises its own, undocumented types
        raise AdapterValidationError(f"{WEIGHTS_NAME} is not a readable safetensors file") from exc


def _check_config(
    config: dict[str, Any], base_model: str, base_aliases: set[str]
) -> tuple[int, str]:
    rank = _rank(config)
    declared = config.get("base_model_name_or_path") or ""
    if not isinstance(declared, str):
        raise AdapterValidationError("base_model_name_or_path must be a string")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterValidationError("only LoRA adapters are supported")
    if declared not in base_aliases:
        raise AdapterValidationError(f"adapter was trained for {declared!r}, not {base_model!r}")
    _check_alpha(config)
    return rank, declared


def validate_adapter(
    archive: Path,
    workdir: Path,
    *,
    base_model: str,
    base_aliases: set[str],
    arch: ModelArchitecture,
    max_lora_rank: int,
    limits: ArchiveLimits = DEFAULT_LIMITS,
) -> ValidatedAdapter:
    """Checks the uploaded zip at `archive`, unpacking it into the empty folder `workdir`,
    against the base model `arch` and the engines' `max_lora_rank`; raises
    AdapterValidationError naming the first problem."""
    try:
        names = {p.name for p in extract_members(archive, workdir, limits)}
    except AdapterArchiveError as exc:  # the shared checks' error, as the admin API's own
        raise AdapterValidationError(str(exc)) from exc
    if CONFIG_NAME not in names or WEIGHTS_NAME not in names:
        raise AdapterValidationError(f"the archive needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    config = read_config(workdir / CONFIG_NAME)
    rank, _ = _check_config(config, base_model, base_aliases)
    try:  # what the engine checks when it loads the adapter, on the shapes alone
        layout = check_adapter(config, _tensor_shapes(workdir / WEIGHTS_NAME), arch, max_lora_rank)
    except InvalidAdapterError as exc:
        raise AdapterValidationError(exc.message) from exc
    _check_finite(workdir / WEIGHTS_NAME)
    return ValidatedAdapter(base_model, rank, layout.target_modules, workdir)


def _check_finite(path: Path) -> None:
    """Refuses a LoRA tensor holding a NaN or an infinity (or in a dtype not checkable).

    Reads the header itself (the file already opened cleanly with safetensors) and scans
    each tensor's bytes through a read-only memory map."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    if path.stat().st_size <= 8 + header_len:
        return  # no tensor data at all (the shapes are then all empty)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, entry in header.items():
        if name == "__metadata__" or _module_of(name) is None:
            continue
        dtype = entry["dtype"]
        if dtype in _INTEGER_DTYPES:
            continue
        if dtype not in _FLOAT_BITS:
            raise AdapterValidationError(f"{name} has dtype {dtype}, which is not supported")
        unsigned, mask = _FLOAT_BITS[dtype]
        begin, end = entry["data_offsets"]
        width = np.dtype(unsigned).itemsize
        step = _SCAN_CHUNK * width
        for start in range(begin, end, step):
            bits = data[start : min(start + step, end)].view(unsigned)
            if np.any((bits & unsigned(mask)) == unsigned(mask)):
                raise AdapterValidationError(f"{name} has non-finite values (NaN or infinity)")


def store_adapter(validated: ValidatedAdapter, folder: Path) -> Path:
    """Moves the validated files to `folder` (which must not exist yet); returns it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.rename(validated.folder, folder)  # same file system: the upload dir is next to it
    return folder
