"""One step's LoRA rows and the grouped (segmented) matmul that applies them.

Per token row: its adapter's A, then its B, added to the base projection. Rows are
grouped by adapter slot once per step, so each adapter runs two small GEMMs per
projection over exactly its rows (gathered), however the batch is mixed; rows with
no adapter cost nothing. This is the torch path (CPU and GPU alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.lora.stacks import LoraStacks


@dataclass(frozen=True)
class LoraGroup:
    """The rows of one slot; `rows` None means every row of the batch."""

    slot: int
    rows: torch.Tensor | None


@dataclass(frozen=True)
class LoraBatch:
    """The per-step view the model's projections read (in the ForwardContext)."""

    stacks: LoraStacks
    groups: tuple[LoraGroup, ...]
    row_slots: torch.Tensor | None = None  # [T] int32, -1: none; set: the triton kernel runs

    @classmethod
    def build(
        cls,
        stacks: LoraStacks,
        row_slots: Sequence[int | None],
        device: torch.device,
        *,
        kernel: bool = False,
    ) -> LoraBatch | None:
        """Groups the token rows by slot; None when no row has an adapter."""
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(row_slots):
            if slot is not None:
                by_slot.setdefault(slot, []).append(row)
        if not by_slot:
            return None
        groups = []
        for slot, rows in by_slot.items():
            if len(rows) == len(row_slots):
                groups.append(LoraGroup(slot, None))
            else:
                groups.append(LoraGroup(slot, torch.tensor(rows, dtype=torch.long, device=device)))
        if kernel:
            slots = [-1 if s is None else s for s in row_slots]
            return cls(stacks, tuple(groups), torch.tensor(slots, dtype=torch.int32, device=device))
        return cls(stacks, tuple(groups))

    def add(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + each row's adapter delta for packed projection `group` (y updated in place)."""
        lora = self.stacks.layers[layer][group]
        rank = lora.rank
        if self.row_slots is not None:
            from engine.kernels.lora_bgmv import bgmv_add_  # triton loads only when asked for

            return bgmv_add_(
                y, x.contiguous(), self.row_slots, lora.a, lora.b, lora.out_slices, rank
            )
        for g in self.groups:
            if group not in self.stacks.groups_of[g.slot]:
                continue
            xs = x if g.rows is None else x.index_select(0, g.rows)
            shrunk = xs @ lora.a[g.slot].T  # [n, slices * R]
            b = lora.b[g.slot]
            parts = [
                shrunk[:, i * rank : (i + 1) * rank] @ b[start:end].T
                for i, (start, end) in enumerate(lora.out_slices)
            ]
            delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
            if g.rows is None:
                y.add_(delta)
            else:
                # Rows of one group are distinct, so gather-add-scatter is exact (and,
                # on the CPU, far cheaper than index_add_).
                y.index_copy_(0, g.rows, y.index_select(0, g.rows).add_(delta))
        return y
