"""compressed-tensors integer checkpoints (`format: pack-quantized`), dequantized at load.

These are the "W4A16"/"W8A16" releases llm-compressor writes (its GPTQ and AWQ
recipes save in this format): per linear, `weight_packed` (integers packed into
int32), `weight_scale` per output channel or per group, `weight_shape`, and for
asymmetric schemes `weight_zero_point`. compressed-tensors' own compressor unpacks
and dequantizes them, so the packing is never re-implemented here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import UnsupportedModelError
from engine.model.checkpoint_tensors import read_tensors_ending

_SIDE = (".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx")
_SKIPPED = (".input_scale", ".input_zero_point", ".input_global_scale")


@dataclass(frozen=True)
class PackedIntScheme:
    """A pack-quantized checkpoint's one weight scheme (its config group's `weights`)."""

    weights: Mapping[str, Any]

    @property
    def label(self) -> str:
        """How the startup summary and the registry name it ("INT4 (pack-quantized, g128)")."""
        strategy = self.weights.get("strategy", "channel")
        group = f"g{self.weights.get('group_size')}" if strategy == "group" else strategy
        return f"INT{self.weights.get('num_bits')} (pack-quantized, {group})"

    def dequantized(
        self, weights: Iterable[tuple[str, torch.Tensor]], files: Iterable[Path]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The weight stream with each packed linear as a float32 `weight`."""
        from compressed_tensors.compressors import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

        try:
            scheme = QuantizationScheme(
                targets=["Linear"], weights=QuantizationArgs(**self.weights)
            )
        except ValueError as exc:
            raise UnsupportedModelError(f"bad pack-quantized weight scheme: {exc}") from None
        side = read_tensors_ending(files, _SIDE)
        for name, tensor in weights:
            if name.endswith(_SIDE + _SKIPPED):
                continue
            if not name.endswith(".weight_packed"):
                yield name, tensor
                continue
            prefix = name.removesuffix("_packed")
            state = {"weight_packed": tensor, **_module_side(side, prefix, scheme.weights)}
            try:
                decoded = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
            except (RuntimeError, ValueError, IndexError, AssertionError) as exc:
                raise UnsupportedModelError(f"cannot unpack {name!r}: {exc}") from None
            yield prefix, decoded


def _module_side(side: Mapping[str, torch.Tensor], prefix: str, args: Any) -> dict[str, Any]:
    """One linear's scale (as float32, so the weight decodes in float32), shape and
    zero point, each checked by name."""
    scale, shape = side.get(prefix + "_scale"), side.get(prefix + "_shape")
    if scale is None or shape is None:
        raise UnsupportedModelError(f"packed weight {prefix!r} lacks weight_scale or weight_shape")
    found: dict[str, Any] = {"weight_scale": scale.float(), "weight_shape": shape}
    if not args.symmetric:
        zero = side.get(prefix + "_zero_point")
        if zero is None:
            raise UnsupportedModelError(f"asymmetric weight {prefix!r} has no weight_zero_point")
        found["weight_zero_point"] = zero
    g_idx = side.get(prefix + "_g_idx")
    if g_idx is not None and args.group_size:
        consecutive = torch.arange(g_idx.numel()) // args.group_size
        if not torch.equal(g_idx.long().flatten(), consecutive):
            # The compressor decodes groups in order; a permuted g_idx would decode wrong.
            raise UnsupportedModelError(f"{prefix!r}: activation-ordered groups are not supported")
    return found


def packed_int_scheme(quantized: Mapping[str, Any]) -> PackedIntScheme | None:
    """The scheme of a compressed-tensors pack-quantized config; None for other formats.
    Several different integer weight schemes in one checkpoint are refused by name."""
    if quantized.get("quant_method") != "compressed-tensors":
        return None
    if quantized.get("format") != "pack-quantized":
        return None
    groups = quantized.get("config_groups") or {}
    schemes = [g.get("weights") for g in groups.values() if isinstance(g, Mapping)]
    kinds = {repr(sorted(s.items())) for s in schemes if isinstance(s, Mapping)}
    if len(kinds) != 1 or not isinstance(schemes[0], Mapping):
        raise UnsupportedModelError(
            f"a pack-quantized checkpoint must declare one weight scheme, found {len(kinds)}"
        )
    weights = schemes[0]
    if weights.get("type") != "int" or weights.get("num_bits") not in (4, 8):
        raise UnsupportedModelError(
            f"pack-quantized weights of type {weights.get('type')!r} with "
            f"{weights.get('num_bits')!r} bits are not supported (int4 and int8 are)"
        )
    return PackedIntScheme(dict(weights))
