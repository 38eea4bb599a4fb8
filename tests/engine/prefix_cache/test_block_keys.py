"""A sequence's block hashes (or radix keys) are computed once, not on every step.

A long prompt that waits for room (the KV pool is held by another sequence) is
looked up at every scheduling step, and under `fair_lpm` also peeked at for queue
order; neither may cut or hash its blocks again.
"""

from __future__ import annotations

from typing import Any

import pytest

import engine.kv_cache.hash_index as hash_index_module
from engine.config import SchedulerConfig
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.index_factory import make_prefix_index
from engine.kv_cache.manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from tests.utils.engine_requests import make_sequence

BS = 4


def _seq(seq_id: str, prompt: list[int], max_tokens: int, *, use_cache: bool = True) -> Sequence:
    return make_sequence(
        seq_id=seq_id,
        request_id=seq_id,
        index=0,
        prompt_token_ids=prompt,
        params=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
        max_tokens=max_tokens,
        cache_domain="t:a",
        use_cache=use_cache,
    )


def _scheduler(mode: str, policy: str, num_blocks: int = 16) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BS, index=make_prefix_index(mode, BS))
    config = SchedulerConfig(scheduling_policy=policy, max_num_batched_tokens=256, max_num_seqs=8)
    return Scheduler(config, kv, eos_token_ids=frozenset(), max_model_len=4096)


def _step(sched: Scheduler) -> None:
    out = sched.schedule()
    sched.update(out, {item.seq.seq_id: 7 for item in out.scheduled if item.samples})


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every block hash the hash index computes."""
    calls: list[int] = []
    real = hash_index_module.block_hash

    def counting(*args: Any) -> bytes:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(hash_index_module, "block_hash", counting)
    return calls


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "fair_lpm"])
@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_a_waiting_prompt_is_keyed_once_over_many_steps(
    mode: str, policy: str, hashes: list[int]
) -> None:
    sched = _scheduler(mode, policy)
    kv = sched.kv
    # The holder takes 10 of 16 blocks and caches nothing (so it hashes nothing).
    holder = _seq("holder", list(range(1, 40)), 30, use_cache=False)
    sched.add(holder)
    _step(sched)
    assert holder.status is SequenceStatus.RUNNING
    waiting = _seq("long", [5] * 4 * BS + list(range(100, 100 + 44)), 4)  # 15 blocks
    sched.add(waiting)
    _step(sched)
    assert waiting.status is SequenceStatus.WAITING  # the pool is short: it waits
    keyed, hashed, work = kv.keyed_blocks, len(hashes), kv.lookup_work
    assert keyed == (len(waiting.prompt_token_ids) - 1) // BS
    for _ in range(20):
        _step(sched)
    assert waiting.status is SequenceStatus.WAITING
    assert kv.lookup_work > work  # it was looked up again on every step...
    assert kv.keyed_blocks == keyed  # ...and not one block keyed again
    assert len(hashes) == hashed
    if mode == "hash":
        assert hashed == keyed


@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_blocks_are_keyed_once_through_fill_preemption_and_readmission(
    mode: str, hashes: list[int]
) -> None:
    sched = _scheduler(mode, "fcfs", num_blocks=12)
    kv = sched.kv
    a = _seq("a", [1] * 20, 20)
    b = _seq("b", [2] * 20, 20)
    sched.add(a)
    sched.add(b)
    while sched.has_unfinished():
        _step(sched)
    assert sched.num_preemptions > 0  # the pool could not hold both to the end
    # Every full block of each sequence was keyed exactly once: looked up while
    # waiting, registered as it filled, and looked up again after its preemption.
    assert kv.keyed_blocks <= sum(s.num_tokens // BS for s in (a, b))
    if mode == "hash":
        assert len(hashes) == kv.keyed_blocks


def test_keys_match_what_the_index_would_compute() -> None:
    """Blocks registered by precomputed keys are found by a plain token lookup."""
    sched = _scheduler("hash", "fcfs")
    first = _seq("first", list(range(1, 18)), 2)
    sched.add(first)
    while sched.has_unfinished():
        _step(sched)
    kv = sched.kv
    assert kv.index is not None
    root = kv._key(first).digest
    found = kv.index.match(root, list(range(1, 17)), 4)
    assert len(found.block_ids) == 4
    again = _seq("again", list(range(1, 18)), 2)
    assert kv.get_computed_blocks(again) == (found.block_ids, 16)
    kv.check_integrity()
