"""A persistent host copy of every live sequence's block table, updated by diffs.

Rebuilding `[num_seqs, max_blocks]` from Python lists each step costs the host
O(batch x context) (256 x 512 ints at 8k context). Block tables change little
from one step to the next: a decode step appends a block every `block_size`
tokens. So each sequence keeps a row here, and a step copies into it only the
ids appended since the row was last synced:

    seq.block_ids   [7, 3, 9, 1, 4]          synced: 3 -> write ids 3..4 only
    row 5           [7, 3, 9, 0, 0, ...]  -> [7, 3, 9, 1, 4, 0, ...]

Contract with the KV cache manager (see `Sequence.block_ids`): a sequence's
`block_ids` list only grows in place; any other change (free, a swapped prefix
block, a test assigning it) replaces the list object, which resyncs the row
whole. The row holds a reference to the list it mirrors, so that list cannot be
freed and another allocated at its address.

The table is a numpy array, not a tensor: it is written both inside the runner's
inference mode and outside it (`release` after a request ends), which torch
forbids for one tensor; and small slice writes cost less in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.sequence import Sequence


@dataclass
class _Row:
    index: int
    mirrored: list[int]  # the very list object last synced
    synced: int  # leading entries of `mirrored` already in the row


class BlockTable:
    """Rows of block ids (int32, zero-padded) for the sequences the runner has seen.

    Grows (rows and width) on demand; `release` frees a sequence's row for reuse.
    """

    def __init__(self, num_rows: int = 8, width: int = 16) -> None:
        self._table = np.zeros((max(1, num_rows), max(1, width)), dtype=np.int32)
        self._rows: dict[str, _Row] = {}
        self._free: list[int] = list(range(self._table.shape[0] - 1, -1, -1))

    @property
    def num_live_rows(self) -> int:
        """Rows held by sequences (for tests and leak checks)."""
        return len(self._rows)

    def sync(self, seq: Sequence) -> int:
        """Brings the row of `seq` up to date with `seq.block_ids`; returns the row index.

        Costs O(blocks appended since the last sync), or O(blocks) after the list
        was replaced.
        """
        ids = seq.block_ids
        row = self._rows.get(seq.seq_id)
        if row is None:
            row = self._rows[seq.seq_id] = _Row(self._take_row(), ids, 0)
        elif row.mirrored is not ids:
            # Replaced (freed, a prefix block swapped, ...): rewrite the row whole.
            stale = row.synced
            row.mirrored, row.synced = ids, 0
            if stale > len(ids):
                self._table[row.index, len(ids) : stale] = 0
        if len(ids) < row.synced:
            # Shrunk in place: against the contract, but cheap to honour.
            self._table[row.index, len(ids) : row.synced] = 0
            row.synced = len(ids)
        if len(ids) > row.synced:
            self._ensure_width(len(ids))
            new = ids[row.synced :]
            self._table[row.index, row.synced : len(ids)] = new
            row.synced = len(ids)
        return row.index

    def gather(self, rows: list[int], width: int) -> torch.Tensor:
        """A new contiguous [len(rows), width] int32 host tensor of those rows' first entries."""
        self._ensure_width(width)
        return torch.from_numpy(self._table[rows, :width])

    def release(self, seq_id: str) -> None:
        """Frees the row of a sequence that will not run again (zeroed for its next owner)."""
        row = self._rows.pop(seq_id, None)
        if row is None:
            return
        self._table[row.index, : row.synced] = 0
        self._free.append(row.index)

    def _take_row(self) -> int:
        if not self._free:
            old = self._table.shape[0]
            grown = np.zeros((old * 2, self._table.shape[1]), dtype=np.int32)
            grown[:old] = self._table
            self._table = grown
            self._free = list(range(old * 2 - 1, old - 1, -1))
        return self._free.pop()

    def _ensure_width(self, width: int) -> None:
        have = self._table.shape[1]
        if width <= have:
            return
        grown = np.zeros((self._table.shape[0], max(width, have * 2)), dtype=np.int32)
        grown[:, :have] = self._table
        self._table = grown
