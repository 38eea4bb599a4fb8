"""Per-domain maps of the KV manager and its ledger stay bounded by live domains.

A domain with nothing cached and no live sequence is pruned; the counters of the
most recent idle domains stay for `domain_stats` (a bounded LRU); rules pushed by
`apply_rules` are configuration and are never pruned.
"""

from __future__ import annotations

from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine.kv_cache.manager import IDLE_DOMAIN_COUNTERS
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.kv_inspect import block_domain, cached_block_ids, domain_map_sizes

NUM_BLOCKS = 32


def _prompt(i: int) -> list[int]:
    return [10 + (i * 7 + k) % 900 for k in range(9)]  # 2 full blocks of 4 and a tail


def test_ten_thousand_one_request_domains_leave_the_maps_bounded() -> None:
    d = CacheDriver.make("hash", num_blocks=NUM_BLOCKS)
    d.check_hits = False  # the reference model walks every cached block: too slow here
    keep = DomainRule(floor_blocks=2, retention_ttl_s=3600.0)
    d.kv.apply_rules(CacheRules(domains=(("t:keep", keep),)))
    n = 10_000
    for i in range(n):
        d.add(_prompt(i), 1, f"t:{i}/k:1")
        if i % 16 == 15:
            d.run()
            if i % 2048 == 2047:
                d.kv.check_integrity()
    d.run()
    d.assert_clean()

    sizes = domain_map_sizes(d.kv)
    cached_domains = len({block_domain(d.kv, b) for b in cached_block_ids(d.kv)})
    assert cached_domains <= NUM_BLOCKS // 2
    assert sizes["live"] == 0
    assert sizes["keys"] <= cached_domains
    assert sizes["cached"] <= cached_domains and sizes["idle"] <= cached_domains
    assert sizes["heaps"] <= cached_domains
    assert sizes["idle_counters"] == IDLE_DOMAIN_COUNTERS
    assert sizes["counters"] <= IDLE_DOMAIN_COUNTERS + cached_domains
    stats = d.kv.domain_stats()
    assert len(stats) <= IDLE_DOMAIN_COUNTERS + cached_domains
    # The most recent domains are still reported, exactly; the oldest were dropped.
    last = stats[f"t:{n - 1}/k:1"]
    assert (last.queries, last.hits, last.query_tokens) == (1, 0, 9)
    assert "t:0/k:1" not in stats
    # Configuration is not pruned.
    assert d.kv.ledger.rule("t:keep/k:9") == keep
    assert d.kv.ledger.floor("t:keep/k:9") == 2

    # A pruned domain starts afresh and hits its own blocks again.
    d.check_hits = True
    first = d.add(_prompt(0), 1, "t:0/k:1")
    d.run()
    again = d.add(_prompt(0), 1, "t:0/k:1")
    d.run()
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 8)
    s = d.kv.domain_stats()["t:0/k:1"]
    assert (s.queries, s.hits, s.cached_tokens) == (2, 1, 8)
    d.assert_clean()


def test_a_domain_with_cached_blocks_or_a_live_sequence_is_kept() -> None:
    d = CacheDriver.make("hash", num_blocks=NUM_BLOCKS)
    held = d.add(_prompt(1), 50, "t:held")  # runs for a while
    d.step()
    cached = d.add(_prompt(2), 1, "t:cached")
    while cached.finish_reason is None:
        d.step()
    assert domain_map_sizes(d.kv)["live"] == 1  # t:held
    assert d.kv.ledger.cached["t:cached"] == 2
    assert "t:cached" in d.kv.domain_stats() and "t:held" in d.kv.domain_stats()
    d.run()
    # Both finished with blocks cached: their counts stay until the blocks are evicted.
    assert d.kv.ledger.cached["t:held"] > 0 and d.kv.ledger.cached["t:cached"] == 2
    assert held.num_output_tokens == 50
    d.assert_clean()


def test_eviction_prunes_the_domain_it_empties() -> None:
    d = CacheDriver.make("hash", num_blocks=8)
    d.add(_prompt(1), 1, "t:gone")
    d.run()
    assert domain_map_sizes(d.kv)["cached"] == 1
    d.add([500 + k for k in range(29)], 1, "t:big")  # 8 blocks: evicts all of t:gone
    d.run()
    assert "t:gone" not in d.kv.ledger.cached and "t:gone" not in d.kv.ledger.idle
    assert domain_map_sizes(d.kv)["keys"] == 1  # t:big's only
    # Its counters stay among the recent idle domains.
    assert d.kv.domain_stats()["t:gone"].evictions == 2
    d.assert_clean()
