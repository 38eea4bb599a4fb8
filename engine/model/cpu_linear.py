"""Float linears on the CPU through weights packed once for oneDNN.

With one torch thread, `F.linear` of a float32 weight falls off a cliff past one row:
on SmolLM2's shapes (AVX-512, MKL) two or three rows cost two to three times one, and
a decode step of two to eight sequences took 90-125 ms where one took 60. The same
weight reordered once into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`)
streams better and keeps such a step near 40-50 ms; one row and long prompts gain
too, less (bench/cpu_linear.py). Each call pays a fixed overhead of some tens of
microseconds, so weights too small for that to vanish (the tiny test models') are
not packed. The packed copy takes as much memory again as the weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Weights with fewer elements than this are never packed: the per-call overhead would
# cost more than the layout saves. Measured on 2 cores over 16 weights in turn (as a
# mixture of experts reads them): packing wins from 128k elements (512x256: 47 vs 77
# us a row) and loses at 110k (192x576: 69 vs 57 us); Qwen3-MoE's 512x384 down
# projections were left out at the old 256k and ran 1.3-2x slower.
MIN_PACKED_WEIGHT = 1 << 17
# The batch the layout is chosen for (a decode step of several sequences).
PACK_FOR_ROWS = 32


def cpu_packing_available() -> bool:
    """Whether this torch build can pack and run oneDNN linear weights on the CPU."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


@dataclass(frozen=True)
class PackedLinear:
    """One float linear with its weight also packed for oneDNN: `(x)` gives
    `F.linear(x, weight, bias)` (float rounding aside), through the packed weight for
    float32 rows, else through the float weight."""

    weight: torch.Tensor  # [out, in], float32, on the CPU
    bias: torch.Tensor | None
    packed: torch.Tensor  # the same weight in oneDNN's blocked layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        if x.dim() == 2 and x.dtype == torch.float32 and x.shape[0] > 0:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), self.packed, self.bias, "none", [], ""
            )
            return out
        return F.linear(x, self.weight, self.bias)


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear | None:
    """`weight` (and `bias`) packed for oneDNN, or None where packing does not apply: a
    weight off the CPU, not float32, smaller than MIN_PACKED_WEIGHT elements, or a torch
    without oneDNN."""
    if (
        weight.device.type != "cpu"
        or weight.dtype != torch.float32
        or weight.dim() != 2
        or weight.numel() < MIN_PACKED_WEIGHT
        or not cpu_packing_available()
    ):
        return None
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_FOR_ROWS)
    return PackedLinear(weight.detach(), None if bias is None else bias.detach(), packed)


def float_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    packed: PackedLinear | None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through `packed` when there is one."""
    if packed is not None:
        return packed(x)
    return F.linear(x, weight, bias)
