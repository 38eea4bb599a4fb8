"""Prefix reuse through the real scheduler and manager, on the fake-KV driver."""

from __future__ import annotations

import pytest

from engine.kv_cache.eviction import PUBLIC, CachePolicy
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.kv_inspect import block_domain, cached_block_ids, set_domain_retention

MODES = ["hash", "radix"]


@pytest.mark.parametrize("mode", MODES)
def test_same_domain_hit_is_block_aligned_and_reported(mode: str) -> None:
    d = CacheDriver.make(mode)
    first = d.add(list(range(1, 11)), 2)  # 10 tokens: 2 full blocks of 4
    d.run()
    second = d.add(list(range(1, 11)) + [50, 51, 52], 2)
    d.run()
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 8
    assert second.output_token_ids == d.seqs[1].output_token_ids
    stats = d.kv.domain_stats()["a"]
    assert (stats.queries, stats.hits, stats.cached_tokens) == (2, 1, 8)
    assert d.kv.hit_tokens == 8 and d.kv.query_tokens == 23
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_last_prompt_token_is_never_a_hit(mode: str) -> None:
    d = CacheDriver.make(mode)
    d.add(list(range(1, 9)), 1)  # exactly 2 blocks
    d.run()
    again = d.add(list(range(1, 9)), 1)
    d.run()
    # Block 2 would cover the last token: only the first block is reused.
    assert again.num_cached_tokens == 4
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_other_domain_and_other_adapter_miss(mode: str) -> None:
    d = CacheDriver.make(mode)
    d.add(list(range(1, 14)), 1, "a")
    d.run()
    b = d.add(list(range(1, 14)), 1, "b")
    lora = d.add(list(range(1, 14)), 1, "a", adapter="x")
    d.run()
    assert b.num_cached_tokens == 0 and lora.num_cached_tokens == 0
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_cache_false_neither_reads_nor_writes(mode: str) -> None:
    d = CacheDriver.make(mode)
    d.add(list(range(1, 14)), 1, use_cache=False)
    d.run()
    assert cached_block_ids(d.kv) == set()
    d.add(list(range(1, 14)), 1)
    d.run()
    opted_out = d.add(list(range(1, 14)), 1, use_cache=False)
    d.run()
    assert opted_out.num_cached_tokens == 0
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_published_prefix_is_shared_and_the_rest_stays_private(mode: str) -> None:
    system = tuple(range(100, 110))  # 2 full blocks shared; tokens 108-109 stay per domain
    d = CacheDriver.make(mode, published=(system,))
    d.add([*system, 1, 2, 3, 4, 5, 6], 1, "a")
    d.run()
    b = d.add([*system, 1, 2, 3, 4, 5, 6], 1, "b")
    d.run()
    assert b.num_cached_tokens == 8  # the published blocks, not a's continuation
    again = d.add([*system, 1, 2, 3, 4, 5, 6, 7], 1, "a")
    d.run()
    assert again.num_cached_tokens == 16
    assert sum(block_domain(d.kv, x) == PUBLIC for x in cached_block_ids(d.kv)) == 2
    # A prompt that merely shares tokens with a non-published prefix gets nothing across domains.
    c = d.add([*system[:9], 0, 1, 2, 3], 1, "c")
    d.run()
    assert c.num_cached_tokens == 0
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_lru_evicts_the_least_recently_used_chain_tail_first(mode: str) -> None:
    d = CacheDriver.make(mode, num_blocks=8)
    d.add(list(range(1, 13)), 1)  # 3 blocks, 2 full -> 2 cached... plus the tail
    d.run()
    d.add(list(range(21, 33)), 1)
    d.run()
    # A 6-block request needs every block: both chains must go, the older one first.
    big = d.add(list(range(41, 65)), 1)
    d.run()
    assert big.num_cached_tokens == 0
    assert d.kv.domain_stats()["a"].evictions >= 4
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_floor_keeps_a_domain_prefix_through_another_domains_flood(mode: str) -> None:
    prefix = list(range(1, 17))  # 4 blocks

    def run(floor: int) -> int:
        d = CacheDriver.make(mode, num_blocks=24, policy=CachePolicy(min_cached_blocks=floor))
        d.add([*prefix, 99], 1, "a")
        d.run()
        for i in range(30):  # unique prompts of b, 5 blocks each
            d.add([1000 + 20 * i + k for k in range(18)], 1, "b")
        d.run()
        back = d.add([*prefix, 98], 1, "a")
        d.run()
        d.assert_clean()
        return back.num_cached_tokens

    assert run(floor=0) == 0
    assert run(floor=4) == 16
    assert run(floor=2) == 8  # down to the floor, not below


@pytest.mark.parametrize("mode", MODES)
def test_strict_partition_caps_each_domain(mode: str) -> None:
    d = CacheDriver.make(mode, num_blocks=32, policy=CachePolicy(min_cached_blocks=3, strict=True))
    for i in range(4):
        d.add([200 * i + k for k in range(1, 22)], 1, "a")
        d.run()
    assert d.kv.domain_stats()["a"].cached_blocks == 3
    b = d.add(list(range(1, 14)), 1, "b")
    d.run()
    assert b.num_cached_tokens == 0
    assert d.kv.domain_stats()["a"].cached_blocks == 3  # b never evicts a
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_retention_ttl_drops_idle_blocks(mode: str) -> None:
    d = CacheDriver.make(mode, policy=CachePolicy(retention_ttl_s=5.0))
    set_domain_retention(d.kv, "b", None)
    d.add(list(range(1, 14)), 1, "a")
    d.add(list(range(1, 14)), 1, "b")
    d.run()
    d.clock.now += 10
    a = d.add(list(range(1, 14)), 1, "a")
    b = d.add(list(range(1, 14)), 1, "b")
    d.run()
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 12
    d.assert_clean()


def test_scrub_lists_blocks_that_leave_a_domain() -> None:
    d = CacheDriver.make("hash", num_blocks=6, policy=CachePolicy(scrub_freed_blocks=True))
    first = d.add(list(range(1, 10)), 1, "a")  # 3 blocks: 2 cached, the partial one freed
    d.run()
    tail = set(d.kv.take_blocks_to_scrub())
    assert len(tail) == 1 and not tail & cached_block_ids(d.kv)
    d.add(list(range(50, 74)), 1, "b")  # 6 blocks: must evict both of a's cached ones
    d.run()
    scrubbed = set(d.kv.take_blocks_to_scrub())
    assert d.kv.domain_stats()["a"].evictions == 2 and first.num_cached_tokens == 0
    assert len(scrubbed) >= 2
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_duplicates_are_deduplicated(mode: str) -> None:
    d = CacheDriver.make(mode)
    a = d.add(list(range(1, 14)), 2)
    b = d.add(list(range(1, 14)), 2)
    d.run()
    assert a.output_token_ids == b.output_token_ids
    assert len(cached_block_ids(d.kv)) == 3  # one copy of the 3 full blocks
    d.assert_clean()


@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_a_lone_request_larger_than_the_free_share_still_finishes(mode: str) -> None:
    # Found by the property test: strict partitions hold 8 of 16 blocks as idle cache and
    # 4 are pinned by a published prefix. A 17-token request of a third domain needs 5;
    # it must be allowed to reclaim others' idle blocks once it is alone, instead of being
    # preempted and re-admitted forever.
    d = CacheDriver.make(
        mode,
        num_blocks=16,
        policy=CachePolicy(min_cached_blocks=4, strict=True),
        published=(tuple(range(500, 516)),),
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    d.add([*range(500, 516), 1, 2, 3, 4, 5], 1, "a")  # computes and pins the published blocks
    d.add(list(range(1, 17)), 1, "a")
    d.add(list(range(100, 116)), 1, "b")
    d.run()
    assert d.kv.pool.num_uncached_free == 4
    lone = d.add(list(range(200, 217)), 2, "c", use_cache=False)
    d.run(max_steps=200)
    assert lone.finish_reason == "length" and len(lone.output_token_ids) == 2
    d.assert_clean()
