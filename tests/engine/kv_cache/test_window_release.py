"""On a model whose every layer has a window, a sequence gives back the blocks behind it
(KVCacheManager.release_behind_window), and the prefix cache stays whole."""

from __future__ import annotations

import pytest

from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.index_factory import make_prefix_index
from engine.kv_cache.manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.validation import window_peak_tokens
from tests.utils.engine_requests import make_sequence
from tests.utils.scheduler_driver import Driver

BLOCK = 4
WINDOW = 8


def manager(index: str, num_blocks: int = 32, window: int | None = WINDOW) -> KVCacheManager:
    return KVCacheManager(
        BlockPool(num_blocks), BLOCK, index=make_prefix_index(index, BLOCK), window=window
    )


def sequence(seq_id: str, prompt: list[int]) -> Sequence:
    params = SamplingParams(max_tokens=64, temperature=0)
    return make_sequence(seq_id=seq_id, prompt_token_ids=prompt, params=params, max_tokens=64)


def computed(kv: KVCacheManager, seq: Sequence, n: int) -> None:
    """What the scheduler does after a step that computed `seq` up to `n` tokens."""
    seq.num_computed_tokens = n
    kv.cache_full_blocks(seq)
    kv.release_behind_window(seq)


@pytest.mark.parametrize("index", ["radix", "hash"])
def test_blocks_behind_the_window_go_back_to_the_pool(index: str) -> None:
    kv = manager(index)
    seq = sequence("a", list(range(100, 130)))
    blocks, _ = kv.get_computed_blocks(seq)
    assert kv.allocate_slots(seq, 30, blocks)
    table = list(seq.block_ids)
    assert len(table) == 8 and kv.pool.num_free == 24
    computed(kv, seq, 30)
    # The next token (position 30) sees 23..30: blocks 0-4 (positions 0-19) are behind.
    assert seq.num_released_blocks == 5 and seq.num_held_blocks == 3
    assert seq.block_ids == [0] * 5 + table[5:]
    assert seq.held_block_ids == table[5:]
    assert kv.pool.num_free == 29
    kv.check_integrity()
    # Only the blocks within the first window are cached (2 of 4 tokens each).
    assert {b for b in table if kv.pool.is_cached(b)} == set(table[:2])
    # One more block fills and one more leaves the window.
    assert kv.allocate_slots(seq, 4)
    computed(kv, seq, 34)
    assert seq.num_released_blocks == 6
    kv.check_integrity()
    kv.free(seq)
    assert kv.pool.num_free == 32 and seq.num_released_blocks == 0
    kv.check_integrity()


@pytest.mark.parametrize("index", ["radix", "hash"])
def test_released_cached_blocks_can_be_evicted_while_the_sequence_runs(index: str) -> None:
    """The cached chain is only as long as the window, so once it is behind the window
    nothing in use hangs under it: all of it can make room for others."""
    kv = manager(index, num_blocks=12)
    seq = sequence("a", list(range(100, 140)))
    assert kv.allocate_slots(seq, 40, kv.get_computed_blocks(seq)[0])
    computed(kv, seq, 40)
    assert seq.num_held_blocks == 2  # positions 32..39: the next token sees 33..40
    assert kv.pool.num_idle == 2  # the cached first window, released
    other = sequence("b", list(range(500, 540)))
    assert kv.allocate_slots(other, 40, kv.get_computed_blocks(other)[0])  # 10 blocks
    assert kv.pool.num_free == 0 and kv.pool.num_idle == 0
    kv.check_integrity()


def test_a_hit_after_release_serves_the_windows_first_blocks() -> None:
    kv = manager("radix")
    first = sequence("a", list(range(100, 140)))
    assert kv.allocate_slots(first, 40, kv.get_computed_blocks(first)[0])
    computed(kv, first, 40)
    kv.free(first)
    again = sequence("b", list(range(100, 140)))
    blocks, hit = kv.get_computed_blocks(again)
    assert hit == WINDOW and len(blocks) == 2
    kv.check_integrity()


def test_without_a_window_nothing_is_released() -> None:
    kv = manager("radix", window=None)
    seq = sequence("a", list(range(100, 130)))
    assert kv.allocate_slots(seq, 30, kv.get_computed_blocks(seq)[0])
    computed(kv, seq, 30)
    assert seq.num_released_blocks == 0 and seq.num_held_blocks == 8
    assert all(kv.pool.is_cached(b) for b in seq.block_ids[:7])


def test_the_scheduler_keeps_each_sequence_within_its_window_peak() -> None:
    """Long prompts and outputs, several at once, on a pool that holds two windows'
    worth: nothing is preempted, every block comes back, and no sequence ever holds
    more than the peak the validator counts on."""
    peak = window_peak_tokens(WINDOW, BLOCK, step_tokens=16)
    assert peak is not None
    driver = Driver.make(num_blocks=2 * peak // BLOCK, window=WINDOW, max_num_batched_tokens=16)
    kv = driver.scheduler.kv
    for i in range(2):
        driver.add(list(range(10 + i, 70 + i)), max_tokens=80)
    most = 0
    while driver.scheduler.has_unfinished():
        driver.step()
        most = max([most, *(s.num_held_blocks for s in driver.scheduler.running)])
        kv.check_integrity()
    assert all(s.num_output_tokens == 80 for s in driver.seqs)
    assert driver.scheduler.num_preemptions == 0
    assert 0 < most <= peak // BLOCK
    assert kv.pool.num_free == kv.num_blocks
