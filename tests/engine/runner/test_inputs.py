"""build_step_inputs: packed fields equal one tensor per field, aligned, with the right dtypes."""

from __future__ import annotations

import torch

from engine.runner.inputs import build_step_inputs
from engine.sampling_params import SamplingParams
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence
from tests.utils.engine_requests import make_sequence

BLOCK = 4


def _seq(name: str, prompt: list[int], outputs: list[int], blocks: list[int]) -> Sequence:
    seq = make_sequence(
        seq_id=name,
        request_id=name,
        index=0,
        prompt_token_ids=prompt,
        params=SamplingParams(),
        max_tokens=16,
        cache_domain="d",
    )
    seq.output_token_ids = list(outputs)
    seq.block_ids = list(blocks)
    return seq


def _reference(output: SchedulerOutput) -> dict[str, list[int] | list[list[int]]]:
    """The fields computed the plain way, token by token."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    starts = [0]
    lens: list[int] = []
    rows: list[int] = []
    width = max([1, *(len(i.seq.block_ids) for i in output.scheduled)])
    for item in output.scheduled:
        seq = item.seq
        every = seq.prompt_token_ids + seq.output_token_ids
        for p in range(item.start, item.end):
            ids.append(every[p])
            pos.append(p)
            slots.append(seq.block_ids[p // BLOCK] * BLOCK + p % BLOCK)
        starts.append(starts[-1] + item.num_new_tokens)
        lens.append(item.end)
        if item.samples:
            rows.append(starts[-1] - 1)
    tables = [i.seq.block_ids + [0] * (width - len(i.seq.block_ids)) for i in output.scheduled]
    return {
        "input_ids": ids,
        "positions": pos,
        "slot_mapping": slots,
        "query_start_loc": starts,
        "seq_lens": lens,
        "logits_indices": rows,
        "block_tables": tables,
    }


def _check(output: SchedulerOutput) -> None:
    got = build_step_inputs(output, BLOCK, torch.device("cpu"))
    tensors = {
        "input_ids": (got.input_ids, torch.int64),
        "positions": (got.positions, torch.int64),
        "slot_mapping": (got.meta.slot_mapping, torch.int64),
        "logits_indices": (got.logits_indices, torch.int64),
        "query_start_loc": (got.meta.query_start_loc, torch.int32),
        "seq_lens": (got.meta.seq_lens, torch.int32),
        "block_tables": (got.meta.block_tables, torch.int32),
    }
    for name, expected in _reference(output).items():
        tensor, dtype = tensors[name]
        assert tensor.dtype == dtype, name
        assert tensor.is_contiguous(), name
        assert tensor.data_ptr() % 16 == 0, name  # kernels see the alignment of a fresh tensor
        assert tensor.tolist() == expected, name
    assert got.meta.block_tables.dim() == 2


def test_mixed_batch_of_prefill_chunks_and_decodes() -> None:
    long = _seq("a", list(range(100, 113)), [], [7, 3, 9, 1])  # 13 tokens over 4 blocks
    decode = _seq("b", [5, 6, 7], [8, 9], [2, 4])
    odd = _seq("c", [11], [12, 13, 14, 15, 16, 17], [6, 5])
    output = SchedulerOutput(
        scheduled=(
            ScheduledSequence(long, 2, 9),  # crosses three block boundaries, does not sample
            ScheduledSequence(decode, 4, 1),
            ScheduledSequence(odd, 6, 1),
        ),
        num_batched_tokens=11,
    )
    _check(output)


def test_single_tokens_and_odd_lengths_keep_every_field_aligned() -> None:
    # Field lengths of 1, 3, 5 ... would put the next field off a 16-byte boundary.
    for n in range(1, 6):
        seqs = [_seq(f"s{i}", [i + 1] * (i + 2), [], [i, i + 10]) for i in range(n)]
        output = SchedulerOutput(
            scheduled=tuple(ScheduledSequence(s, i + 1, 1) for i, s in enumerate(seqs)),
            num_batched_tokens=n,
        )
        _check(output)


def test_empty_step() -> None:
    got = build_step_inputs(
        SchedulerOutput(scheduled=(), num_batched_tokens=0), BLOCK, torch.device("cpu")
    )
    assert got.input_ids.numel() == 0 and got.meta.block_tables.shape == (0, 1)
    assert got.meta.query_start_loc.tolist() == [0]
