"""BlockPool and KVCacheManager bookkeeping, with exact counts on tiny pools."""

import pytest

from engine.kv_cache.block_pool import BlockPool, BlockPoolError
from engine.kv_cache.manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tests.utils.engine_requests import make_sequence
from tests.utils.kv_inspect import ref_count


def make_seq(n_prompt: int, seq_id: str = "s") -> Sequence:
    return make_sequence(
        seq_id=seq_id,
        request_id=seq_id,
        index=0,
        prompt_token_ids=list(range(n_prompt)),
        params=SamplingParams(max_tokens=4),
        max_tokens=4,
        cache_domain="d",
    )


def test_allocate_and_free_round_trip() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(3)
    assert len(set(ids)) == 3 and pool.num_free == 1
    assert pool.free(ids) == list(reversed(ids))
    assert pool.num_free == 4
    pool.check_integrity()


def test_shared_block_survives_one_free() -> None:
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.incref([block])
    assert pool.free([block]) == []
    assert ref_count(pool, block) == 1 and pool.num_free == 1
    assert pool.free([block]) == [block]
    pool.check_integrity()


def test_double_free_and_overallocation_are_errors() -> None:
    pool = BlockPool(1)
    ids = pool.allocate(1)
    with pytest.raises(BlockPoolError):
        pool.allocate(1)
    pool.free(ids)
    with pytest.raises(BlockPoolError):
        pool.free(ids)


def test_manager_allocates_blocks_for_token_growth() -> None:
    kv = KVCacheManager(BlockPool(5), block_size=4)
    seq = make_seq(6)
    assert kv.allocate_slots(seq, 6)  # 6 tokens -> 2 blocks
    assert len(seq.block_ids) == 2
    seq.num_computed_tokens = 6
    assert kv.allocate_slots(seq, 2)  # 8 tokens still fit in 2 blocks
    assert len(seq.block_ids) == 2
    seq.num_computed_tokens = 8
    assert kv.allocate_slots(seq, 1)
    assert len(seq.block_ids) == 3
    other = make_seq(12, "o")
    assert not kv.allocate_slots(other, 12)  # needs 3, only 2 free: nothing changes
    assert other.block_ids == [] and kv.pool.num_free == 2
    kv.free(seq)
    assert kv.pool.num_free == 5
    kv.check_integrity()
