"""GPTQ and AWQ checkpoints (integer weights in groups), dequantized at load.

Both store a quantized linear as `qweight` (int32 words of packed integers), `qzeros`
(the groups' zero points, packed the same way), `scales` (one per group and output
column) and, for GPTQ, `g_idx` (each input row's group; act-order checkpoints permute
it). A weight is

    weight[out, in] = (q[in, out] - zero[group(in), out]) * scale[group(in), out]

The layouts differ in how the integers are packed:
- GPTQ (AutoGPTQ, GPTQModel): `qweight` [in / per, out], packed along the input rows,
  low bits first; `qzeros` [groups, out / per], along the columns. The original format
  ("gptq", v1) stores each zero point minus one; "gptq_v2" stores it as it is.
- AWQ (AutoAWQ's GEMM layout): `qweight` [in, out / 8] and `qzeros` [groups, out / 8],
  both along the columns, with the eight columns of a word in AWQ's interleaved order
  (columns 0, 2, 4, 6, 1, 3, 5, 7 from the low nibble up).

GPTQModel and AutoAWQ are CUDA-centred toolkits, so the few lines of unpacking live
here rather than as a dependency.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.model.checkpoint_tensors import read_tensors_ending

_SIDE = (".qzeros", ".scales", ".g_idx")
_GPTQ_BITS = (2, 4, 8)  # the widths that fill an int32 word exactly
_GPTQ_FORMATS = {"gptq": 1, "gptq_v2": 0}  # -> what to add to a stored zero point
# The AWQ word's nibble that holds each of its eight columns.
_AWQ_COLUMN_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)


@dataclass(frozen=True)
class GroupedIntScheme:
    """A GPTQ or AWQ checkpoint's quantization, read from its `quantization_config`."""

    method: str  # "gptq" or "awq"
    bits: int
    group_size: int  # -1: one group over each whole row
    zero_offset: int  # added to each stored zero point (GPTQ v1 stores zero - 1)

    @property
    def label(self) -> str:
        """How the startup summary and the registry name it ("GPTQ 4-bit g128")."""
        group = "per row" if self.group_size == -1 else f"g{self.group_size}"
        return f"{self.method.upper()} {self.bits}-bit {group}"

    def dequantized(
        self, weights: Iterable[tuple[str, torch.Tensor]], files: Iterable[Path]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The weight stream with each packed linear as a float32 `weight`."""
        side = read_tensors_ending(files, _SIDE)
        for name, tensor in weights:
            if name.endswith(_SIDE):
                continue
            if not name.endswith(".qweight"):
                yield name, tensor
                continue
            prefix = name.removesuffix(".qweight")
            yield prefix + ".weight", self.dequantize(prefix, tensor, side)

    def dequantize(
        self, prefix: str, qweight: torch.Tensor, side: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """One linear's weight [out, in] from its packed tensors (checked by name)."""
        qzeros, scales = (_side(side, prefix, suffix) for suffix in (".qzeros", ".scales"))
        for tensor, suffix in ((qweight, "qweight"), (qzeros, "qzeros")):
            if tensor.dtype != torch.int32 or tensor.dim() != 2:
                raise UnsupportedModelError(
                    f"{prefix}.{suffix} must be a 2-D int32 tensor, not "
                    f"{tensor.dtype} {list(tensor.shape)}"
                )
        if scales.dim() != 2:
            raise UnsupportedModelError(f"{prefix}.scales must be 2-D, not {list(scales.shape)}")
        if self.method == "awq":
            q = _awq_columns(unpack_columns(qweight, self.bits))
            zeros = _awq_columns(unpack_columns(qzeros, self.bits))
        else:
            q = unpack_rows(qweight, self.bits)
            zeros = unpack_columns(qzeros, self.bits)
        rows, cols = q.shape
        groups = self._groups(prefix, rows, scales.shape[0], side.get(prefix + ".g_idx"))
        if scales.shape[1] != cols or zeros.shape[0] != scales.shape[0] or zeros.shape[1] < cols:
            raise UnsupportedModelError(
                f"{prefix}: qweight {list(qweight.shape)}, qzeros {list(qzeros.shape)} and "
                f"scales {list(scales.shape)} do not describe one {self.label} matrix"
            )
        zero = zeros[:, :cols] + self.zero_offset
        weight = (q - zero[groups]).float() * scales.float()[groups]
        return weight.t().contiguous()

    def _groups(
        self, prefix: str, rows: int, count: int, g_idx: torch.Tensor | None
    ) -> torch.Tensor:
        """Each input row's group: GPTQ's `g_idx` when stored, else consecutive runs."""
        if g_idx is not None and self.method == "gptq":
            groups = g_idx.long().flatten()
            if groups.numel() != rows or (rows and not int(groups.min()) >= 0):
                raise UnsupportedModelError(f"{prefix}.g_idx does not give each of {rows} rows")
        else:
            size = rows if self.group_size == -1 else self.group_size
            groups = torch.arange(rows) // size
        if rows and int(groups.max()) >= count:
            raise UnsupportedModelError(
                f"{prefix} needs {int(groups.max()) + 1} groups of scales, the checkpoint has "
                f"{count}"
            )
        return groups


def grouped_int_scheme(quantized: Mapping[str, Any]) -> GroupedIntScheme | None:
    """The scheme of a GPTQ or AWQ `quantization_config`; None for other methods.
    Layouts with no plain unpacking here (AWQ's GEMV, Marlin, bit widths that straddle
    words) are refused by name."""
    method = str(quantized.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        return None
    bits = quantized.get("bits", quantized.get("w_bit"))
    group = quantized.get("group_size", quantized.get("q_group_size", 128))
    if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or group > 0):
        raise UnsupportedModelError(f"{method} group_size must be -1 or positive, not {group!r}")
    if method == "gptq":
        layout = quantized.get("checkpoint_format") or quantized.get("format") or "gptq"
        if bits not in _GPTQ_BITS or layout not in _GPTQ_FORMATS:
            raise UnsupportedModelError(
                f"GPTQ with bits={bits!r} in format {layout!r} is not supported "
                f"(bits {list(_GPTQ_BITS)}, formats {sorted(_GPTQ_FORMATS)})"
            )
        return GroupedIntScheme("gptq", int(bits), group, _GPTQ_FORMATS[str(layout)])
    version = str(quantized.get("version", "gemm")).lower()
    if bits != 4 or version != "gemm" or quantized.get("zero_point") is False:
        raise UnsupportedModelError(
            f"AWQ with bits={bits!r}, version={version!r}, "
            f"zero_point={quantized.get('zero_point')!r} is not supported "
            "(4-bit GEMM checkpoints with zero points are)"
        )
    return GroupedIntScheme("awq", 4, group, 0)


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] words -> [R * per, C] integers: word r's k-th value (low bits first)
    becomes row r * per + k."""
    values = _split_words(packed, bits)  # [R, C, per]
    return values.permute(0, 2, 1).reshape(-1, packed.shape[1])


def unpack_columns(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] words -> [R, C * per] integers: word c's k-th value (low bits first)
    becomes column c * per + k."""
    return _split_words(packed, bits).reshape(packed.shape[0], -1)


def _split_words(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Each int32 word's 32 / bits values, low bits first, as int32 [..., per]."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def _awq_columns(unpacked: torch.Tensor) -> torch.Tensor:
    """Puts each word's eight AWQ-interleaved columns back in their order."""
    rows = unpacked.shape[0]
    return unpacked.view(rows, -1, 8)[:, :, list(_AWQ_COLUMN_NIBBLE)].reshape(rows, -1)


def _side(side: Mapping[str, torch.Tensor], prefix: str, suffix: str) -> torch.Tensor:
    tensor = side.get(prefix + suffix)
    if tensor is None:
        raise UnsupportedModelError(f"quantized weight {prefix!r} has no {suffix[1:]} tensor")
    return tensor
