"""Property tests: random interleavings of domains, adapters and shared prefixes.

Every run goes through the fake-KV driver, whose checks hold at each admission:
adopted blocks were written for the same key (or are published), and the hit is
exactly the cached same-key prefix. After the run, outputs must equal a cache-off
run, reference counts are back to zero and no block is lost.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kv_cache.eviction import CachePolicy
from tests.engine.prefix_cache.cache_driver import CacheDriver

PUBLISHED = tuple(range(500, 510))  # 2 full blocks of 4, plus 2 tokens
BASES = [list(range(1, 13)), list(range(1, 9)) + [70, 71, 72, 73], [30, 31, 32, 33, 34, 35]]
POLICIES = {
    "lru": CachePolicy(),
    "floor": CachePolicy(min_cached_blocks=3),
    "share": CachePolicy(min_cached_share=0.1),
    "strict": CachePolicy(min_cached_blocks=4, strict=True),
    "ttl": CachePolicy(retention_ttl_s=6.0, scrub_freed_blocks=True),
}

request = st.tuples(
    st.integers(0, 6),  # arrival step
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([None, None, "x"]),
    st.sampled_from(["none", "base0", "base1", "base2", "published"]),
    st.lists(st.integers(1, 40), min_size=1, max_size=7),
    st.integers(1, 4),  # max_tokens
    st.booleans().map(lambda b: b or True),  # mostly cached ...
    st.integers(0, 9),  # ... and 1 in 10 opts out
)


def build_prompt(prefix: str, suffix: list[int]) -> list[int]:
    if prefix == "published":
        return [*PUBLISHED, *suffix]
    if prefix.startswith("base"):
        return [*BASES[int(prefix[-1])], *suffix]
    return suffix


def replay(trace: list[tuple], mode: str, policy: CachePolicy, num_blocks: int) -> CacheDriver:
    d = CacheDriver.make(
        mode,
        num_blocks=num_blocks,
        policy=policy,
        published=(PUBLISHED,),
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    pending = sorted(enumerate(trace), key=lambda x: x[1][0])
    step = 0
    while pending or d.scheduler.has_unfinished():
        while pending and pending[0][1][0] <= step:
            _, (_, domain, adapter, prefix, suffix, max_tokens, _, opt) = pending.pop(0)
            d.add(build_prompt(prefix, suffix), max_tokens, domain, adapter=adapter, use_cache=opt)
        if d.scheduler.has_unfinished():
            d.step()
        else:
            d.clock.now += 1.0
        step += 1
        assert step < 5000
    return d


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(request, min_size=1, max_size=14),
    st.sampled_from(["hash", "radix"]),
    st.sampled_from(sorted(POLICIES)),
    st.sampled_from([16, 24, 64]),
)
def test_random_traffic_keeps_isolation_hits_outputs_and_counts(
    trace: list[tuple], mode: str, policy_name: str, num_blocks: int
) -> None:
    trace = [(*r[:7], r[7] != 0) for r in trace]
    d = replay(trace, mode, POLICIES[policy_name], num_blocks)
    d.assert_clean()
    off = replay([(*r[:7], False) for r in trace], mode, POLICIES[policy_name], num_blocks)
    assert [s.output_token_ids for s in d.seqs] == [s.output_token_ids for s in off.seqs]
    assert all(s.num_cached_tokens == 0 for s in off.seqs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request, min_size=1, max_size=14), st.sampled_from(sorted(POLICIES)))
def test_hash_and_radix_give_the_same_hits(trace: list[tuple], policy_name: str) -> None:
    trace = [(*r[:7], r[7] != 0) for r in trace]
    runs = [replay(trace, mode, POLICIES[policy_name], 24) for mode in ("hash", "radix")]
    assert runs[0].hit_log == runs[1].hit_log
    assert [s.num_cached_tokens for s in runs[0].seqs] == [
        s.num_cached_tokens for s in runs[1].seqs
    ]
    assert runs[0].kv.domain_stats() == runs[1].kv.domain_stats()
