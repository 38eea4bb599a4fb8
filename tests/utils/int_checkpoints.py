"""Tiny GPTQ, AWQ and pack-quantized Hugging Face folders, packed as their tools pack.

The packing here follows each format's published layout (GPTQ's rows packed low bits
first and v1's zero points stored minus one; AWQ's interleaved column order) and is
written apart from the engine's unpacking, so a test of one checks the other; the
pack-quantized folders are written by compressed-tensors' own compressor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tests.utils.hf_families import make_family_dir

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column each nibble holds, low first


@dataclass(frozen=True)
class Layout:
    """One quantized layout to write: method, bits, group, and its variant."""

    method: str  # "gptq", "awq" or "pack-quantized"
    bits: int = 4
    group: int = 32
    variant: str = ""  # gptq: "v2" or "act-order"; pack-quantized: "asym"

    @property
    def name(self) -> str:
        """A test id."""
        return (
            f"{self.method}-{self.bits}b-g{self.group}{'-' + self.variant if self.variant else ''}"
        )


def quantize_groups(
    w: torch.Tensor, bits: int, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min-max quantization of w [out, in] with each input row in its group:
    (q [in, out], zero [groups, out], scale [groups, out] fp16)."""
    top = (1 << bits) - 1
    wt = w.t()
    count = int(groups.max()) + 1
    zero = torch.zeros(count, w.shape[0], dtype=torch.int64)
    scale = torch.zeros(count, w.shape[0], dtype=torch.float16)
    q = torch.zeros_like(wt, dtype=torch.int64)
    for g in range(count):
        rows = wt[groups == g]
        lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
        s = ((hi - lo) / top).clamp(min=1e-4).half()
        z = torch.round(-lo / s.float()).clamp(0, top).long()
        q[groups == g] = (torch.round(rows / s.float()) + z).clamp(0, top).long()
        zero[g], scale[g] = z, s
    return q, zero, scale


def pack_words(
    values: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] = ()
) -> torch.Tensor:
    """Packs non-negative integers into int32 words along `dim`, value k of each word at
    bits * k; `order` says which of the word's columns goes to each slot."""
    per = 32 // bits
    values = values.long() if dim == 1 else values.long().t()
    order = order or tuple(range(per))
    words = torch.zeros(values.shape[0], values.shape[1] // per, dtype=torch.int64)
    for slot, column in enumerate(order):
        words |= (values[:, column::per] & ((1 << bits) - 1)) << (bits * slot)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words if dim == 1 else words.t().contiguous()


def make_int_folder(tmp: Path, family: str, layout: Layout) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny `family` model with its projections quantized in `layout`; returns the
    folder and the weights its quantized tensors decode to (the reference)."""
    folder = make_family_dir(tmp, family, seed=7, intermediate_size=96)
    state = load_file(str(folder / "model.safetensors"))
    decoded = dict(state)
    for name, w in list(state.items()):
        if w.dim() != 2 or "proj" not in name:
            continue
        prefix = name.removesuffix(".weight")
        del state[name]
        if layout.method == "pack-quantized":
            packed, decoded[name] = _pack_quantized(w, layout)
            state.update({f"{prefix}.{k}": v for k, v in packed.items()})
            continue
        groups = _groups(w.shape[1], layout)
        q, zero, scale = quantize_groups(w, layout.bits, groups)
        if layout.method == "gptq" and layout.variant != "v2":
            # v1 stores zero - 1 in `bits` bits: a zero of 0 comes back as 2**bits, as
            # GPTQ's own kernels read it.
            zero = ((zero - 1) & ((1 << layout.bits) - 1)) + 1
        decoded[name] = ((q - zero[groups]) * scale.float()[groups]).t().contiguous()
        if layout.method == "awq":
            state[f"{prefix}.qweight"] = pack_words(q, 4, 1, AWQ_PACK_ORDER)
            state[f"{prefix}.qzeros"] = pack_words(zero, 4, 1, AWQ_PACK_ORDER)
        else:
            stored = zero if layout.variant == "v2" else zero - 1
            state[f"{prefix}.qweight"] = pack_words(q, layout.bits, 0)
            state[f"{prefix}.qzeros"] = pack_words(stored, layout.bits, 1)
            state[f"{prefix}.g_idx"] = groups.to(torch.int32)
        state[f"{prefix}.scales"] = scale
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config(layout)
    (folder / "config.json").write_text(json.dumps(config))
    return folder, decoded


def _groups(rows: int, layout: Layout) -> torch.Tensor:
    """Each input row's group; act-order checkpoints assign them out of order."""
    size = rows if layout.group == -1 else layout.group
    groups = torch.arange(rows) // size
    if layout.variant == "act-order":
        groups = groups[torch.randperm(rows, generator=torch.Generator().manual_seed(3))]
    return groups


def quantization_config(layout: Layout) -> dict[str, Any]:
    """The `quantization_config` each tool writes for the layout."""
    if layout.method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": layout.group,
                "zero_point": True, "version": "gemm"}  # fmt: skip
    if layout.method == "gptq":
        return {"quant_method": "gptq", "bits": layout.bits, "group_size": layout.group,
                "desc_act": layout.variant == "act-order", "sym": False,
                "checkpoint_format": "gptq_v2" if layout.variant == "v2" else "gptq"}  # fmt: skip
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": _ct_weights(layout)}},
        "ignore": ["lm_head"],
    }


def _ct_weights(layout: Layout) -> dict[str, Any]:
    grouped = layout.group != -1
    return {
        "num_bits": layout.bits,
        "type": "int",
        "symmetric": layout.variant != "asym",
        "strategy": "group" if grouped else "channel",
        "group_size": layout.group if grouped else None,
    }


def _pack_quantized(
    w: torch.Tensor, layout: Layout
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """compressed-tensors' compressor on w: its tensors and what they decode to."""
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**_ct_weights(layout))
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    columns = w.shape[1] if layout.group == -1 else layout.group
    tiles = w.reshape(w.shape[0], -1, columns)
    scale, zero = calculate_qparams(tiles.amin(-1), tiles.amax(-1), args)
    state = {"weight": w, "weight_scale": scale.float(), "weight_zero_point": zero}
    packed = PackedQuantizationCompressor.compress(state, scheme)
    decoded = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
    return packed, decoded.float()
