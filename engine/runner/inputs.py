"""Builds one step's flat model inputs from the scheduler's output.

scheduled:  seq A (prefill chunk, 5 tokens) | seq B (decode, 1) | seq C (decode, 1)
input_ids:  a5 a6 a7 a8 a9                  | b12              | c3
positions:   5  6  7  8  9                  | 12               |  3
query_start_loc: [0, 5, 6, 7]      seq_lens: [10, 13, 4]
logits rows: the last row of every sequence that samples this step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionMetadata
from engine.scheduler.output import SchedulerOutput


@dataclass(frozen=True)
class StepInputs:
    """Device tensors for one forward pass, plus which rows produce logits."""

    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # int64 [num_sampling_seqs]
    sampling_positions: tuple[int, ...]  # index into output.scheduled of each logits row


def build_step_inputs(output: SchedulerOutput, block_size: int, device: torch.device) -> StepInputs:
    """Lays the scheduled tokens end to end and derives slots, block tables and lengths."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    query_lens: list[int] = []
    logits_rows: list[int] = []
    sampling_positions: list[int] = []
    max_blocks = 1
    for idx, item in enumerate(output.scheduled):
        seq = item.seq
        input_ids.extend(seq.token_ids(item.start, item.end))
        span = range(item.start, item.end)
        positions.extend(span)
        table = seq.block_ids
        slots.extend(table[p // block_size] * block_size + p % block_size for p in span)
        query_start.append(query_start[-1] + item.num_new_tokens)
        query_lens.append(item.num_new_tokens)
        seq_lens.append(item.end)
        max_blocks = max(max_blocks, len(table))
        if item.samples:
            logits_rows.append(query_start[-1] - 1)
            sampling_positions.append(idx)

    tables = torch.zeros((len(output.scheduled), max_blocks), dtype=torch.int32)
    for row, item in enumerate(output.scheduled):
        ids = item.seq.block_ids
        if ids:
            tables[row, : len(ids)] = torch.tensor(ids, dtype=torch.int32)

    def dev(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    meta = AttentionMetadata(
        slot_mapping=dev(slots, torch.int64),
        query_start_loc=dev(query_start, torch.int32),
        seq_lens=dev(seq_lens, torch.int32),
        block_tables=tables.to(device, non_blocking=True),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        query_lens_cpu=tuple(query_lens),
        seq_lens_cpu=tuple(seq_lens),
    )
    return StepInputs(
        input_ids=dev(input_ids, torch.int64),
        positions=dev(positions, torch.int64),
        meta=meta,
        logits_indices=dev(logits_rows, torch.int64),
        sampling_positions=tuple(sampling_positions),
    )
