"""The device slots' weights: per layer and packed projection, A and B of every slot.

The model packs q/k/v into one GEMM and gate/up into another, so an adapter's A
matrices are stacked to match: one shrink GEMM per packed projection gives every
slice's [r] activations side by side, and each slice's B expands its own columns of
the packed output. Ranks below `max_rank` are zero-padded, which adds exactly zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelArchitecture
from engine.lora.peft import AdapterWeights, module_shape

# Packed projection -> the HF projections it computes, in output order.
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


@dataclass(frozen=True)
class PackedLora:
    """One layer's packed projection: A [slots, slices * R, in], B [slots, out, R]."""

    a: torch.Tensor
    b: torch.Tensor
    out_slices: tuple[tuple[int, int], ...]  # each slice's output columns [start, end)
    rank: int  # R, the padded rank


class LoraStacks:
    """Holds `max_loras` adapters on the device; `load` fills one slot."""

    def __init__(
        self,
        arch: ModelArchitecture,
        *,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.arch = arch
        self.max_rank = max_rank
        self.layers: list[dict[str, PackedLora]] = []
        for _ in range(arch.num_layers):
            packed: dict[str, PackedLora] = {}
            for group, modules in GROUPS.items():
                fan_in = module_shape(arch, modules[0])[0]
                bounds, start = [], 0
                for module in modules:
                    out = module_shape(arch, module)[1]
                    bounds.append((start, start + out))
                    start += out
                a = torch.zeros(
                    max_loras, len(modules) * max_rank, fan_in, dtype=dtype, device=device
                )
                b = torch.zeros(max_loras, start, max_rank, dtype=dtype, device=device)
                packed[group] = PackedLora(a, b, tuple(bounds), max_rank)
            self.layers.append(packed)
        # Per slot: the packed projections its adapter touches (others are skipped).
        self.groups_of: list[frozenset[str]] = [frozenset()] * max_loras

    @torch.no_grad()
    def load(self, slot: int, weights: AdapterWeights) -> None:
        """Copies an adapter into `slot`, zeroing what it does not target."""
        rank = weights.info.rank
        touched: set[str] = set()
        for layer, packed in enumerate(self.layers):
            for group, modules in GROUPS.items():
                lora = packed[group]
                lora.a[slot].zero_()
                lora.b[slot].zero_()
                for i, module in enumerate(modules):
                    pair = weights.modules.get((layer, module))
                    if pair is None:
                        continue
                    a, b = pair
                    row = i * self.max_rank
                    lora.a[slot, row : row + rank].copy_(a)
                    start, end = lora.out_slices[i]
                    lora.b[slot, start:end, :rank].copy_(b)
                    touched.add(group)
        self.groups_of[slot] = frozenset(touched)
