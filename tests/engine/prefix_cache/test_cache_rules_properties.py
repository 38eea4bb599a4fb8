"""Property test: random traffic with random rule pushes between steps.

Pushes change per-root floors, TTLs and scrub, and publish or withdraw two
published prefixes (one a prefix of the other) while sequences run over them.
The driver checks every hit and every adopted block against its reference model;
the manager's integrity holds after every step and push; outputs equal a
cache-off run; at the end nothing is held, nothing is lost, and every public
block left is pinned by a prefix published now.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine.kv_cache.eviction import PUBLIC, CachePolicy
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.kv_inspect import block_domain, cached_block_ids, ref_count

SHORT = tuple(range(500, 510))  # 2 full blocks of 4, plus 2 tokens
LONG = (*SHORT, *range(600, 606))  # 4 full blocks, starting with SHORT
DOMAINS = ["a", "a/k:1", "a/k:1/u:1", "a/k:2", "b"]
ROOTS = ["a", "a/k:1", "b"]

rule = st.builds(
    DomainRule,
    floor_blocks=st.sampled_from([None, 0, 2, 6]),
    floor_share=st.sampled_from([None, 0.1]),
    retention_ttl_s=st.sampled_from([None, 3.0, 50.0]),
    scrub_freed_blocks=st.sampled_from([None, True, False]),
)
push = st.builds(
    lambda roots, rules, published: CacheRules(
        domains=tuple(zip(roots, rules, strict=False)), published=published
    ),
    st.lists(st.sampled_from(ROOTS), unique=True, max_size=3),
    st.lists(rule, min_size=3, max_size=3),
    st.sampled_from([(), (SHORT,), (LONG,), (SHORT, LONG)]),
)
event = st.one_of(
    st.tuples(
        st.just("req"),
        st.sampled_from(DOMAINS),
        st.sampled_from(["none", "short", "long"]),
        st.lists(st.integers(1, 40), min_size=1, max_size=6),
        st.integers(1, 5),
    ),
    st.tuples(st.just("push"), push),
    st.tuples(st.just("wait"), st.integers(1, 4)),
)


def _prompt(prefix: str, suffix: list[int]) -> list[int]:
    return {"none": [], "short": list(SHORT), "long": list(LONG)}[prefix] + suffix


def _replay(events: list[tuple], mode: str, num_blocks: int, cache: bool) -> CacheDriver:
    d = CacheDriver.make(
        mode,
        num_blocks=num_blocks,
        policy=CachePolicy(retention_ttl_s=20.0),
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    for ev in events:
        if ev[0] == "req":
            _, domain, prefix, suffix, max_tokens = ev
            d.add(_prompt(prefix, suffix), max_tokens, domain, use_cache=cache)
        elif ev[0] == "push":
            d.kv.apply_rules(ev[1])
            d.published = list(ev[1].published)
            d.kv.check_integrity()
        else:
            for _ in range(ev[1]):
                if d.scheduler.has_unfinished():
                    d.step()
                    d.kv.check_integrity()
                else:
                    d.clock.now += 1.0
    d.run()
    return d


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(event, min_size=1, max_size=24),
    st.sampled_from(["hash", "radix"]),
    st.sampled_from([16, 24, 48]),
)
def test_random_pushes_keep_integrity_isolation_and_outputs(
    events: list[tuple], mode: str, num_blocks: int
) -> None:
    d = _replay(events, mode, num_blocks, cache=True)
    d.assert_clean()
    for b in cached_block_ids(d.kv):
        if block_domain(d.kv, b) == PUBLIC:
            assert ref_count(d.kv.pool, b) == 1  # pinned, by a prefix published now
    off = _replay(events, mode, num_blocks, cache=False)
    assert [s.output_token_ids for s in d.seqs] == [s.output_token_ids for s in off.seqs]
