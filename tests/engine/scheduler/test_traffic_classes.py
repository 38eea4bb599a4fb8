"""Interactive and batch work on one engine: batch work runs in the capacity interactive
work leaves. Every test runs the fake model over the real scheduler and cache and
asserts the schedule (never a time): an interactive request is admitted within one
step of arriving into an engine full of batch work, and is in every step after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.errors import InvalidRequestError
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.scheduler.output import SchedulerOutput
from engine.scheduler.step_budget import MIN_PREFILL_TOKENS
from engine.sequence import Sequence
from tests.engine.prefix_cache.cache_driver import CacheDriver


def add(d: CacheDriver, tail: int, max_tokens: int, *, batch: bool, prompt: int = 8) -> Sequence:
    return d.add([tail, *range(1000, 1000 + prompt - 1)], max_tokens, f"t{tail}",
                 fairness_key="batch-tenant" if batch else f"t{tail}", batch=batch)  # fmt: skip


def ids(out: SchedulerOutput) -> set[str]:
    return {item.seq.seq_id for item in out.scheduled}


def iter_steps(d: CacheDriver) -> Iterator[SchedulerOutput]:
    """Steps `d` to the end, yielding each step's output."""
    while d.scheduler.has_unfinished():
        yield d.step()


def test_an_interactive_request_takes_a_seat_from_batch_work_at_once() -> None:
    d = CacheDriver.make("hash", num_blocks=256, max_num_seqs=4)
    batch = [add(d, 10 + i, 200, batch=True) for i in range(6)]
    for _ in range(5):
        d.step()
    assert sum(s in d.scheduler.running for s in batch) == 4  # every seat is batch work
    user = add(d, 99, 20, batch=False)
    out = d.step()
    assert user.seq_id in ids(out)  # admitted in the very next step
    assert len(out.preempted) == 1 and out.preempted[0].batch
    # Its inter-token schedule is what it would be alone: one token every step.
    while not user.is_finished:
        assert user.seq_id in ids(d.step())
    assert user.num_preemptions == 0
    d.run()
    d.assert_clean()


def test_an_interactive_request_takes_kv_blocks_from_batch_work() -> None:
    d = CacheDriver.make("hash", num_blocks=24, max_num_seqs=8)  # 96 token slots
    for i in range(3):
        add(d, 10 + i, 60, batch=True)
    for _ in range(40):
        d.step()
    assert d.kv.pool.num_free <= 2  # batch work holds the pool
    user = add(d, 99, 30, batch=False)
    out = d.step()
    assert user.seq_id in ids(out)
    assert out.preempted and all(s.batch for s in out.preempted)
    preempted_users = 0
    while d.scheduler.has_unfinished():
        out = d.step()
        preempted_users += sum(not s.batch for s in out.preempted)
        if not user.is_finished:
            assert user.seq_id in ids(out)
    assert preempted_users == 0  # batch work never preempts interactive work
    d.assert_clean()


def test_batch_work_is_admitted_only_while_no_interactive_request_waits() -> None:
    d = CacheDriver.make("hash", num_blocks=256, max_num_seqs=2)
    early_batch = add(d, 10, 5, batch=True)
    users = [add(d, 20 + i, 5, batch=False) for i in range(3)]
    first = d.step()
    assert ids(first) == {users[0].seq_id, users[1].seq_id}  # the batch one arrived first
    admitted: list[str] = []  # seq ids in the order they first ran
    for out in [first, *iter_steps(d)]:
        admitted += [i for i in sorted(ids(out)) if i not in admitted]
    # The third user waited for a seat; the batch request, there first, waited for it.
    assert admitted == [users[0].seq_id, users[1].seq_id, users[2].seq_id, early_batch.seq_id]
    assert early_batch.is_finished
    d.assert_clean()


def test_a_batch_prompt_chunk_sits_out_while_interactive_work_waits() -> None:
    d = CacheDriver.make("hash", num_blocks=256, max_num_seqs=4, max_num_batched_tokens=16)
    big = add(d, 10, 4, batch=True, prompt=64)
    d.step()
    assert big.num_computed_tokens == 16  # chunked: 16 of 64 prompt tokens
    user = add(d, 99, 4, batch=False, prompt=12)
    out = d.step()
    assert ids(out) == {user.seq_id}  # the newcomer's prompt has the step to itself
    out = d.step()
    assert big.seq_id in ids(out)  # nothing interactive waits: the batch prompt goes on
    d.run()
    d.assert_clean()


def test_the_traffic_class_is_checked_by_name() -> None:
    with pytest.raises(InvalidRequestError, match="traffic_class must be one of"):
        EngineRequest(prompt_token_ids=(1, 2), params=SamplingParams(), traffic_class="bulk")
    assert EngineRequest(prompt_token_ids=(1,), params=SamplingParams()).traffic_class == (
        "interactive"
    )


@pytest.mark.parametrize("kv_shares", [True, False])
def test_growing_interactive_work_preempts_batch_work_not_the_newest(kv_shares: bool) -> None:
    # Without shares the victim is the newest sequence: here always an interactive one.
    d = CacheDriver.make("hash", num_blocks=20, max_num_seqs=8, kv_shares=kv_shares)
    batch = add(d, 10, 40, batch=True)
    d.step()
    users = [add(d, 20 + i, 30, batch=False) for i in range(2)]
    preempted: list[Sequence] = []
    for out in iter_steps(d):
        preempted += out.preempted
    assert preempted and all(s is batch for s in preempted)
    assert all(u.is_finished and u.num_preemptions == 0 for u in users)
    d.assert_clean()


def test_beside_interactive_work_batch_rows_take_turns() -> None:
    # Without measured step costs, a step carries half as many batch rows as
    # interactive ones (here one), in turns, so every batch sequence moves.
    d = CacheDriver.make("hash", num_blocks=256, max_num_seqs=8)
    batch = [add(d, 10 + i, 60, batch=True) for i in range(4)]
    for _ in range(3):
        d.step()
    assert all(s in d.scheduler.running for s in batch)
    users = [add(d, 20 + i, 40, batch=False) for i in range(2)]
    d.step()  # the users' prompts
    before = {s.seq_id: s.num_computed_tokens for s in batch}
    for _ in range(8):
        out = d.step()
        assert {u.seq_id for u in users} <= ids(out)
        assert sum(item.seq.batch for item in out.scheduled) == 1
    assert all(s.num_computed_tokens > before[s.seq_id] for s in batch)  # each had a turn
    d.run()
    d.assert_clean()


def test_an_interactive_prompt_beside_batch_work_keeps_the_whole_prompt_budget() -> None:
    # Two tenants with work split a step's prompt tokens; a batch tenant is not one of
    # them while interactive work runs (its prompt tokens come from the pace), so the
    # one interactive tenant's prompt goes in one step as it would alone.
    d = CacheDriver.make("hash", num_blocks=256, max_num_seqs=8, max_num_batched_tokens=64)
    batch = [add(d, 10 + i, 60, batch=True) for i in range(2)]
    for _ in range(3):
        d.step()
    assert all(s.num_computed_tokens > 8 for s in batch)  # decoding
    user = add(d, 99, 4, batch=False, prompt=48)
    d.step()
    assert user.num_computed_tokens == 48
    d.run()
    d.assert_clean()


def test_before_step_costs_are_measured_a_batch_prompt_beside_users_goes_in_small_chunks() -> None:
    # Until the step budget knows what a batch row and a prompt token cost, a batch
    # prompt beside interactive decodes takes at most the budget's least chunk a step,
    # never the whole token budget (which would stretch the users' step many times).
    d = CacheDriver.make("hash", num_blocks=256, max_num_seqs=8, max_num_batched_tokens=256)
    users = [add(d, 20 + i, 40, batch=False) for i in range(2)]
    d.step()
    big = add(d, 10, 4, batch=True, prompt=128)
    chunks: list[int] = []
    while big.num_computed_tokens < 128:
        out = d.step()
        assert {u.seq_id for u in users} <= ids(out)
        chunks += [i.num_new_tokens for i in out.scheduled if i.seq is big]
    assert max(chunks) == MIN_PREFILL_TOKENS and sum(chunks) == 128
    d.run()
    d.assert_clean()
