"""Builds one step's flat model inputs from the scheduler's output.

scheduled:  seq A (prefill chunk, 5 tokens) | seq B (decode, 1) | seq C (decode, 1)
input_ids:  a5 a6 a7 a8 a9                  | b12              | c3
positions:   5  6  7  8  9                  | 12               |  3
query_start_loc: [0, 5, 6, 7]      seq_lens: [10, 13, 4]
logits rows: the last row of every sequence that samples this step; a verify row
(speculative decoding: the last known token then k draft tokens) has k + 1 of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionMetadata
from engine.runner.block_table import BlockTable
from engine.scheduler.output import SchedulerOutput

# Triton specialises kernels on 16-byte-aligned pointers; packed fields keep that alignment.
_ALIGN_BYTES = 16


@dataclass(frozen=True)
class StepInputs:
    """Device tensors for one forward pass, plus which rows produce logits."""

    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # int64 [num logits rows]
    sampling_positions: tuple[int, ...]  # index into output.scheduled of each sampling seq
    # Logits rows of each sampling sequence, in the order of `sampling_positions`: 1, or
    # 1 + its draft tokens for a verify row. () when every sequence has one row.
    rows_per_seq: tuple[int, ...] = ()
    # Overlap scheduling: (index into input_ids, sequence id) of each input token the
    # step before this one is still sampling (`PENDING_TOKEN`), filled in just before
    # the forward pass (ModelRunner.run). () when every input token is known.
    pending: tuple[tuple[int, str], ...] = ()


def build_step_inputs(
    output: SchedulerOutput,
    block_size: int,
    device: torch.device,
    block_table: BlockTable | None = None,
) -> StepInputs:
    """Lays the scheduled tokens end to end and derives slots, block tables and lengths.

    `block_table` is the runner's persistent copy of the block tables, synced here by
    diffs; without one, a throwaway table is built from the lists.
    """
    table_rows = block_table if block_table is not None else BlockTable()
    for seq in output.preempted:
        # Their blocks are gone; a re-admitted sequence starts a fresh row.
        table_rows.release(seq.seq_id)
    rows: list[int] = []
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    query_lens: list[int] = []
    logits_rows: list[int] = []
    sampling_positions: list[int] = []
    rows_per_seq: list[int] = []
    pending: list[tuple[int, str]] = []
    max_blocks = 1
    for idx, item in enumerate(output.scheduled):
        seq = item.seq
        if seq.has_pending_token and item.known_end == seq.num_tokens:
            # Only the last token can be pending; it is this row's last known input.
            pending.append((query_start[-1] + item.known_end - 1 - item.start, seq.seq_id))
        input_ids.extend(seq.token_ids(item.start, item.known_end))
        input_ids.extend(item.spec)
        positions.extend(range(item.start, item.end))
        table = seq.block_ids
        _extend_slots(slots, table, item.start, item.end, block_size)
        query_start.append(query_start[-1] + item.num_new_tokens)
        query_lens.append(item.num_new_tokens)
        seq_lens.append(item.end)
        max_blocks = max(max_blocks, len(table))
        rows.append(table_rows.sync(seq))
        if item.samples:
            last = query_start[-1] - 1
            logits_rows.extend(range(last - len(item.spec), last + 1))
            sampling_positions.append(idx)
            rows_per_seq.append(1 + len(item.spec))

    tables = table_rows.gather(rows, max_blocks)
    ids_t, positions_t, slots_t, logits_t = _pack(
        (input_ids, positions, slots, logits_rows), torch.int64, device
    )
    query_start_t, seq_lens_t, tables_t = _pack(
        (query_start, seq_lens, tables), torch.int32, device
    )
    meta = AttentionMetadata(
        slot_mapping=slots_t,
        query_start_loc=query_start_t,
        seq_lens=seq_lens_t,
        block_tables=tables_t.view(len(output.scheduled), max_blocks),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        query_lens_cpu=tuple(query_lens),
        seq_lens_cpu=tuple(seq_lens),
    )
    return StepInputs(
        input_ids=ids_t,
        positions=positions_t,
        meta=meta,
        logits_indices=logits_t,
        sampling_positions=tuple(sampling_positions),
        rows_per_seq=tuple(rows_per_seq) if len(logits_rows) > len(rows_per_seq) else (),
        pending=tuple(pending),
    )


def _extend_slots(slots: list[int], table: list[int], start: int, end: int, size: int) -> None:
    """Appends the flat KV slots of positions [start, end): one range per block touched."""
    pos = start
    while pos < end:
        block, offset = divmod(pos, size)
        first = table[block] * size + offset
        count = min(size - offset, end - pos)
        slots.extend(range(first, first + count))
        pos += count


def _pack(
    fields: tuple[list[int] | torch.Tensor, ...], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """One host tensor and one copy to the device for several int fields; returns views.

    Building and copying a tensor costs far more than its few values, so the fields
    share one. Each view starts on a 16-byte boundary, as a tensor of its own would
    be aligned for the kernels that read it. A field given as a host tensor (the
    block tables) is copied in whole, never through a Python list.
    """
    step = max(1, _ALIGN_BYTES // dtype.itemsize)
    parts: list[torch.Tensor] = []
    flat: list[int] = []  # list fields not yet turned into a part
    bounds: list[tuple[int, int]] = []
    size = 0
    for values in fields:
        count = values.numel() if isinstance(values, torch.Tensor) else len(values)
        pad = -count % step
        bounds.append((size, size + count))
        size += count + pad
        if isinstance(values, torch.Tensor):
            if flat:
                parts.append(torch.tensor(flat, dtype=dtype))
                flat = []
            parts.append(values.reshape(-1).to(dtype))
            flat = [0] * pad
        else:
            flat.extend(values)
            flat.extend([0] * pad)
    if flat or not parts:
        parts.append(torch.tensor(flat, dtype=dtype))
    host = parts[0] if len(parts) == 1 else torch.cat(parts)
    packed = host.to(device, non_blocking=True)
    return [packed[begin:end] for begin, end in bounds]
