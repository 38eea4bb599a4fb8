"""One step's LoRA rows and the two torch paths that apply each row's adapter delta.

Per token row: its adapter's A, then its B, added to the base projection. This is the
torch path (CPU and GPU alike); the triton BGMV kernel is opt-in (`row_slots`).

- Grouped: rows are grouped by slot once per step, and each adapter runs two small
  GEMMs per projection over exactly its rows. Cheapest when one adapter has (nearly)
  the whole batch, e.g. a long prefill; but it is a Python loop over adapters, per
  projection and layer, which dominates a decode batch mixing many adapters.
- Segmented: rows are laid out once per step in a padded [slots, M] grid (M: the most
  rows any slot has); each projection is then a fixed handful of batched ops however
  many adapters are mixed: one gather of x, one bmm shrink, one bmm expand per output
  slice, one gather back. Padded cells are masked to zero, and rows without an adapter
  read a padding cell whose delta is then zeroed, so the delta is exact. `build` picks
  it when the padding is small.

Either way no row's delta depends on another row's values: a broken adapter (NaN
weights) or a NaN row spoils only its own rows (a padding cell reads row 0 through some
slot's A and B, and 0 * NaN is NaN, hence the zeroing rather than a multiply by 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.lora.stacks import LoraStacks, PackedLora

# The segmented grid may hold up to this many cells per real row before the grouped
# path is used instead (padding is computed for nothing). Measured on SmolLM2-135M
# on the CPU: see bench/multi_lora.py.
MAX_PADDING_FACTOR = 2.0


@dataclass(frozen=True)
class LoraGroup:
    """The rows of one slot; `rows` None means every row of the batch."""

    slot: int
    rows: torch.Tensor | None


@dataclass(frozen=True)
class LoraSegments:
    """The step's padded [slots, M] grid of rows, built once and read by every layer.

    `first_slot`/`num_slots`: the slots of the grid, a contiguous range of the stacks
    (a view, no copy) unless `slot_index` names them. `cells` [S*M]: the row each grid
    cell reads (padding reads row 0); `mask` [S, M, 1]: 1 for real cells. `cell_of_row`
    [T]: each row's cell (a zeroed padding cell for a row without an adapter).
    """

    first_slot: int
    num_slots: int
    slot_index: torch.Tensor | None
    width: int  # M
    cells: torch.Tensor
    mask: torch.Tensor
    cell_of_row: torch.Tensor
    groups: frozenset[str]  # packed projections any slot of the grid touches
    # [T, 1] bool, True for the rows without an adapter (their padding cell's delta is
    # zeroed); None when every row has one.
    base_rows: torch.Tensor | None = None

    def stack(self, t: torch.Tensor) -> torch.Tensor:
        """The grid's slots of a [max_loras, ...] stack."""
        if self.slot_index is not None:
            return t.index_select(0, self.slot_index)
        return t.narrow(0, self.first_slot, self.num_slots)


@dataclass(frozen=True)
class LoraBatch:
    """The per-step view the model's projections read (in the ForwardContext)."""

    stacks: LoraStacks
    groups: tuple[LoraGroup, ...]
    row_slots: torch.Tensor | None = None  # [T] int32, -1: none; set: the triton kernel runs
    segments: LoraSegments | None = None  # set: the segmented (batched) path runs

    @classmethod
    def build(
        cls,
        stacks: LoraStacks,
        row_slots: Sequence[int | None],
        device: torch.device,
        *,
        kernel: bool = False,
        segmented: bool | None = None,
    ) -> LoraBatch | None:
        """Groups the token rows by slot; None when no row has an adapter.

        `segmented` None: the segmented path when more than one slot is mixed and the
        padded grid is at most MAX_PADDING_FACTOR times the rows; True/False force it.
        """
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
        grid = _grid_shape(by_slot, len(row_slots))
        if segmented is None:
            segmented = len(by_slot) > 1 and grid[1] * grid[2] <= MAX_PADDING_FACTOR * len(
                row_slots
            )
        if not segmented:
            return cls(stacks, tuple(groups))
        return cls(stacks, tuple(groups), segments=_segments(stacks, by_slot, row_slots, device))

    def add(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + each row's adapter delta for packed projection `group` (y updated in place)."""
        lora = self.stacks.layers[layer][group]
        if self.row_slots is not None:
            from engine.kernels.lora_bgmv import bgmv_add_  # triton loads only when asked for

            return bgmv_add_(
                y, x.contiguous(), self.row_slots, lora.a, lora.b, lora.out_slices, lora.rank
            )
        if self.segments is not None:
            if group in self.segments.groups:
                _segmented_add(self.segments, lora, x, y)
            return y
        for g in self.groups:
            if group not in self.stacks.groups_of[g.slot]:
                continue
            xs = x if g.rows is None else x.index_select(0, g.rows)
            delta = _expand(xs @ lora.a[g.slot].T, lora.b[g.slot], lora)
            if g.rows is None:
                y.add_(delta)
            else:
                # Rows of one group are distinct, so gather-add-scatter is exact (and,
                # on the CPU, far cheaper than index_add_).
                y.index_copy_(0, g.rows, y.index_select(0, g.rows).add_(delta))
        return y


def _expand(shrunk: torch.Tensor, b: torch.Tensor, lora: PackedLora) -> torch.Tensor:
    """Each output slice's B over its own rank-wide block of `shrunk` ([n, slices*R])."""
    rank = lora.rank
    parts = [
        shrunk[:, i * rank : (i + 1) * rank] @ b[start:end].T
        for i, (start, end) in enumerate(lora.out_slices)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _segmented_add(seg: LoraSegments, lora: PackedLora, x: torch.Tensor, y: torch.Tensor) -> None:
    """y += delta over the padded grid: batched over slots, no Python loop over adapters."""
    rank, s, m = lora.rank, seg.num_slots, seg.width
    xs = x.index_select(0, seg.cells).view(s, m, x.shape[1])
    shrunk = torch.bmm(xs, seg.stack(lora.a).transpose(1, 2)).mul_(seg.mask)  # [S, M, K]
    b = seg.stack(lora.b)  # [S, out, R]
    parts = [
        torch.bmm(shrunk[:, :, i * rank : (i + 1) * rank], b[:, start:end].transpose(1, 2))
        for i, (start, end) in enumerate(lora.out_slices)
    ]
    delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    rows = delta.view(s * m, -1).index_select(0, seg.cell_of_row)
    if seg.base_rows is not None:
        rows.masked_fill_(seg.base_rows, 0.0)
    y.add_(rows)


def _grid_shape(by_slot: dict[int, list[int]], num_rows: int) -> tuple[bool, int, int]:
    """(contiguous, S, M) of the segmented grid for these groups."""
    lo, hi = min(by_slot), max(by_slot)
    contiguous = hi - lo + 1 <= 2 * len(by_slot)  # a few empty slots beat a gather copy
    num_slots = hi - lo + 1 if contiguous else len(by_slot)
    width = max(len(rows) for rows in by_slot.values())
    covered = sum(len(rows) for rows in by_slot.values())
    if covered < num_rows and width * num_slots == covered:
        width += 1  # rows without an adapter need a padding cell to read (zero)
    return contiguous, num_slots, width


def _segments(
    stacks: LoraStacks,
    by_slot: dict[int, list[int]],
    row_slots: Sequence[int | None],
    device: torch.device,
) -> LoraSegments:
    contiguous, num_slots, width = _grid_shape(by_slot, len(row_slots))
    first = min(by_slot)
    order = list(range(first, first + num_slots)) if contiguous else sorted(by_slot)
    cells = [0] * (num_slots * width)
    mask = [0.0] * (num_slots * width)
    cell_of_row = [-1] * len(row_slots)
    pad = -1
    for i, slot in enumerate(order):
        rows = by_slot.get(slot, [])
        for j, row in enumerate(rows):
            cells[i * width + j] = row
            mask[i * width + j] = 1.0
            cell_of_row[row] = i * width + j
        if pad < 0 and len(rows) < width:
            pad = i * width + len(rows)
    base = [c < 0 for c in cell_of_row]
    cell_of_row = [pad if c < 0 else c for c in cell_of_row]
    dtype = stacks.layers[0]["qkv"].a.dtype
    touched = frozenset().union(*(stacks.groups_of[s] for s in by_slot))
    return LoraSegments(
        first_slot=first,
        num_slots=num_slots,
        slot_index=None if contiguous else torch.tensor(order, dtype=torch.long, device=device),
        width=width,
        cells=torch.tensor(cells, dtype=torch.long, device=device),
        mask=torch.tensor(mask, dtype=dtype, device=device).view(num_slots, width, 1),
        cell_of_row=torch.tensor(cell_of_row, dtype=torch.long, device=device),
        groups=touched,
        base_rows=(
            torch.tensor(base, dtype=torch.bool, device=device).view(-1, 1) if any(base) else None
        ),
    )
