"""The persistent block table: rows synced by diffs must always equal `seq.block_ids`.

Unit tests drive `BlockTable` through every way a sequence's list changes; the
engine tests check each step's `meta.block_tables` against the lists while
preemption, aborts, prefix-block swaps and row reuse happen.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

import engine.runner.model_runner as model_runner
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.runner.block_table import BlockTable
from engine.runner.inputs import StepInputs, build_step_inputs
from engine.sampling_params import SamplingParams
from engine.scheduler.output import SchedulerOutput
from engine.sequence import Sequence
from tests.utils.engine_requests import make_sequence
from tests.utils.fast_fake_model import fast_fake_llm_engine


def _seq(name: str) -> Sequence:
    return make_sequence(
        seq_id=name,
        request_id=name,
        index=0,
        prompt_token_ids=[1, 2, 3],
        params=SamplingParams(),
        max_tokens=4,
        cache_domain="d",
    )


def _row(table: BlockTable, seq: Sequence, width: int) -> list[int]:
    (row,) = table.gather([table.sync(seq)], width).tolist()
    return list(row)


def _padded(ids: list[int], width: int) -> list[int]:
    return ids + [0] * (width - len(ids))


def test_appends_replacements_and_shrinks_are_all_seen() -> None:
    table = BlockTable(num_rows=1, width=2)
    seq = _seq("a")
    seq.block_ids.extend([5, 6, 7])  # wider than the table: it grows
    assert _row(table, seq, 6) == _padded([5, 6, 7], 6)
    seq.block_ids.append(9)
    assert _row(table, seq, 6) == _padded([5, 6, 7, 9], 6)
    # A swapped prefix block arrives as a new list: the whole row is rewritten.
    seq.block_ids = [5, 4, 7, 9]
    assert _row(table, seq, 6) == _padded([5, 4, 7, 9], 6)
    # Freed (a new, empty list), then re-admitted with fewer blocks: no stale tail.
    seq.block_ids = []
    assert _row(table, seq, 6) == [0] * 6
    seq.block_ids.extend([3])
    assert _row(table, seq, 6) == _padded([3], 6)
    seq.block_ids = [8, 8, 8, 8, 8]
    table.sync(seq)
    seq.block_ids = [2]
    assert _row(table, seq, 6) == _padded([2], 6)
    # Shrunk in place (against the contract) still reads right.
    seq.block_ids.extend([4, 4])
    table.sync(seq)
    del seq.block_ids[1:]
    assert _row(table, seq, 6) == _padded([2], 6)


def test_released_rows_are_zeroed_and_reused() -> None:
    table = BlockTable(num_rows=1, width=4)
    a, b, c = _seq("a"), _seq("b"), _seq("c")
    a.block_ids.extend([1, 2, 3, 4])
    b.block_ids.extend([5])
    row_a, row_b = table.sync(a), table.sync(b)  # the second row grows the table
    assert row_a != row_b and table.num_live_rows == 2
    table.release("a")
    table.release("a")  # twice is harmless
    c.block_ids.extend([7])
    assert table.sync(c) == row_a  # the freed row is reused ...
    assert table.gather([row_a, row_b], 4).tolist() == [[7, 0, 0, 0], [5, 0, 0, 0]]  # ... clean
    assert table.num_live_rows == 2


def test_random_histories_match_the_lists() -> None:
    rng = random.Random(7)
    table = BlockTable(num_rows=2, width=2)
    seqs = {f"s{i}": _seq(f"s{i}") for i in range(12)}
    for _ in range(2000):
        name = rng.choice(list(seqs))
        seq = seqs[name]
        action = rng.random()
        if action < 0.55:
            seq.block_ids.extend(rng.randrange(1, 500) for _ in range(rng.randrange(1, 4)))
        elif action < 0.65 and seq.block_ids:
            fresh = list(seq.block_ids)
            fresh[rng.randrange(len(fresh))] = rng.randrange(1, 500)
            seq.block_ids = fresh
        elif action < 0.75:
            seq.block_ids = []
        elif action < 0.82:
            table.release(name)
            seqs[name] = _seq(name)  # the id comes back as a new sequence
        live = rng.sample(list(seqs.values()), rng.randrange(1, len(seqs)))
        width = max(1, *(len(s.block_ids) for s in live))
        rows = [table.sync(s) for s in live]
        got = table.gather(rows, width).tolist()
        assert got == [_padded(s.block_ids, width) for s in live]


# -- in the engine -------------------------------------------------------------------------


class _Checked:
    """Wraps `build_step_inputs`: every step's block tables must equal the lists."""

    def __init__(self) -> None:
        self.steps = 0
        self.preempted = 0

    def __call__(self, output: SchedulerOutput, *args: Any) -> StepInputs:
        inputs = build_step_inputs(output, *args)
        width = inputs.meta.block_tables.shape[1]
        expected = [_padded(list(i.seq.block_ids), width) for i in output.scheduled]
        assert inputs.meta.block_tables.tolist() == expected
        assert width == max([1, *(len(i.seq.block_ids) for i in output.scheduled)])
        self.steps += 1
        self.preempted += len(output.preempted)
        return inputs


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> _Checked:
    check = _Checked()
    monkeypatch.setattr(model_runner, "build_step_inputs", check)
    return check


def _run(engine: LLMEngine, abort_every: int = 0) -> int:
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if abort_every and steps % abort_every == 0 and engine.requests:
            engine.abort(next(iter(engine.requests)))
    return steps


def test_tables_stay_right_through_preemption_abort_and_row_reuse(checked: _Checked) -> None:
    engine = fast_fake_llm_engine(
        num_blocks=40, block_size=4, max_num_seqs=6, max_num_batched_tokens=64
    )
    rng = random.Random(3)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for wave in range(3):  # later waves reuse the rows the earlier ones released
        for _ in range(8):
            prompt = [rng.randrange(100, 5000) for _ in range(rng.randrange(3, 30))]
            engine.add_request(EngineRequest(prompt_token_ids=tuple(prompt), params=params))
        _run(engine, abort_every=7 if wave == 1 else 0)
    assert checked.preempted > 0  # the small pool forced preemptions
    assert engine.runner.block_table.num_live_rows == 0  # every row was released
    engine.kv.check_integrity()


def test_tables_follow_swapped_prefix_blocks(checked: _Checked) -> None:
    # A published prefix computed by three tenants in the same step (a tenant waits for
    # its own domain's blocks in flight, never another's): the second registration
    # finds the first's public blocks cached and swaps its own for them (a new list).
    engine = fast_fake_llm_engine(num_blocks=64, block_size=4, max_num_seqs=4)
    prompt = list(range(200, 218))  # 4 full blocks and a partial one
    engine.kv.publish_prefix(prompt[:16])
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ids = [
        engine.add_request(
            EngineRequest(prompt_token_ids=tuple(prompt), params=params, cache_domain=f"t{i}")
        )
        for i in range(3)
    ]
    engine.step()  # the prefill of all three
    if engine.overlap is not None:
        engine.overlap.drain()  # a step launched ahead registers its blocks when taken
    seqs = [engine.requests[i].seqs[0] for i in ids]
    assert seqs[0].block_ids[:4] == seqs[1].block_ids[:4] == seqs[2].block_ids[:4]
    assert len({s.block_ids[4] for s in seqs}) == 3  # the partial blocks stay private
    # The freed duplicates go to new requests that write into them.
    engine.add_request(EngineRequest(prompt_token_ids=tuple(list(range(900, 930))), params=params))
    _run(engine)
    assert checked.steps > 10
    engine.kv.check_integrity()


def test_a_throwaway_table_equals_the_persistent_one() -> None:
    engine = fast_fake_llm_engine(num_blocks=64, block_size=4, max_num_seqs=4)
    for n in (5, 9, 13):
        engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(list(range(300, 300 + n))),
                params=SamplingParams(max_tokens=6),
            )
        )
    while engine.scheduler.has_unfinished():
        output = engine.scheduler.schedule()
        fresh = build_step_inputs(output, 4, torch.device("cpu"))
        kept = build_step_inputs(output, 4, torch.device("cpu"), engine.runner.block_table)
        assert torch.equal(fresh.meta.block_tables, kept.meta.block_tables)
        sampled = engine.runner.execute(output)
        for seq in engine.scheduler.update(output, {k: v.token_id for k, v in sampled.items()}):
            if seq.is_finished:
                engine.runner.release(seq.seq_id)


def test_a_table_grown_inside_a_step_is_released_outside_it(checked: _Checked) -> None:
    # Rows and width both outgrow the initial table during `execute` (inference mode);
    # `release` then runs in the engine's plain mode when the requests end.
    engine = fast_fake_llm_engine(
        num_blocks=1024, block_size=4, max_num_seqs=16, max_num_batched_tokens=4096
    )
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for i in range(12):
        engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(list(range(1000 + i, 1000 + i + 120 + 9 * i))), params=params
            )
        )
    _run(engine)
    assert engine.runner.block_table.num_live_rows == 0
    assert checked.steps >= 5
