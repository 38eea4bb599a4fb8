"""FP8 checkpoints from Hugging Face folders, dequantized at load.

Two layouts are read, the ones FP8 releases ship in:
- `quant_method: fp8` (transformers' fine-grained FP8, DeepSeek-V3 style): float8_e4m3
  weights with `weight_scale_inv` per block of `weight_block_size` (often 128 x 128);
- `quant_method: compressed-tensors` with `format: float-quantized` (the "FP8" and
  "FP8-dynamic" releases): float8_e4m3 weights with `weight_scale` per output channel
  or per tensor; `input_scale` (static activation scales) is not needed for weights.

    weight = float8_weight.float() * scale        (the scale broadcast per block/row)

Layers a checkpoint leaves unquantized (its `ignore` list, typically lm_head) are
ordinary tensors and pass through.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.model.checkpoint_tensors import read_tensors_ending

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_SCALES = ("weight_scale", "weight_scale_inv")
_SKIPPED = ("input_scale", "weight_zero_point", "input_zero_point")


@dataclass(frozen=True)
class Fp8Scheme:
    """An FP8 checkpoint's layout: its method and, for fine-grained FP8, the scale block."""

    method: str  # "fp8" or "compressed-tensors"
    block: tuple[int, int] | None

    @property
    def label(self) -> str:
        """How the startup summary and the registry name it ("FP8 (fp8)")."""
        return f"FP8 ({self.method})"

    def dequantized(
        self, weights: Iterable[tuple[str, torch.Tensor]], files: Iterable[Path]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The weight stream with each float8 weight as float32."""
        return dequantize_fp8(weights, read_tensors_ending(files, _SCALES), self.block)


def fp8_scheme(quantized: Mapping[str, Any]) -> Fp8Scheme | None:
    """The FP8 layout a `quantization_config` declares; None for other methods."""
    method = quantized.get("quant_method")
    if method == "fp8":
        return Fp8Scheme("fp8", block_size_of(quantized))
    if method == "compressed-tensors" and _float8_groups(quantized):
        return Fp8Scheme("compressed-tensors", None)
    return None


def _float8_groups(quantized: Mapping[str, Any]) -> bool:
    """Whether every weight scheme of a compressed-tensors config is 8-bit float."""
    if quantized.get("format") not in ("float-quantized", "naive-quantized"):
        return False
    groups = quantized.get("config_groups") or {}
    schemes = [g.get("weights") or {} for g in groups.values() if isinstance(g, Mapping)]
    return bool(schemes) and all(
        s.get("type") == "float" and s.get("num_bits") == 8 for s in schemes
    )


def dequantize_fp8(
    weights: Iterable[tuple[str, torch.Tensor]],
    scales: Mapping[str, torch.Tensor],
    block: tuple[int, int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with each float8 weight as float32 and the scale tensors left out."""
    for name, tensor in weights:
        if name.endswith(_SCALES + _SKIPPED):
            continue
        if tensor.dtype not in FP8_DTYPES:
            yield name, tensor
            continue
        scale = scales.get(f"{name}_scale", scales.get(f"{name}_scale_inv"))
        if scale is None:
            raise UnsupportedModelError(
                f"FP8 weight {name!r} has no weight_scale in the checkpoint"
            )
        yield name, tensor.float() * _broadcast(scale, tuple(tensor.shape), block, name)


def _broadcast(
    scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int] | None, name: str
) -> torch.Tensor:
    """A scale (per tensor, per row, or per block) expanded to multiply the weight."""
    if scale.numel() == 1:
        return scale.reshape(())
    if len(shape) == 2 and scale.shape == (shape[0], 1):
        return scale
    if len(shape) == 2 and scale.dim() == 2 and block is not None:
        rows, cols = block
        expected = (math.ceil(shape[0] / rows), math.ceil(shape[1] / cols))
        if tuple(scale.shape) == expected:
            full = scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)
            return full[: shape[0], : shape[1]]
    raise UnsupportedModelError(
        f"FP8 weight {name!r} {list(shape)} has a scale of shape {list(scale.shape)} "
        "that fits no per-tensor, per-row or per-block layout"
    )


def block_size_of(quantized: Mapping[str, Any]) -> tuple[int, int] | None:
    """The (rows, cols) block of a fine-grained FP8 config's scales, if it has one."""
    block = quantized.get("weight_block_size")
    if block is None:
        return None
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise UnsupportedModelError(
            f"weight_block_size must be two positive integers, not {block!r}"
        )
    return block[0], block[1]
