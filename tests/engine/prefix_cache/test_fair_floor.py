"""The default floor against eviction floods (`fair_cached_share`): a tenant flooding
the pool with long one-token prompts cannot evict a quiet tenant's cached prefix, the
parts of all tenants together stay within the share, and a tenant's many domains share
one part."""

from __future__ import annotations

from engine.config import CacheConfig
from engine.kv_cache.eviction import CachePolicy
from tests.engine.prefix_cache.cache_driver import CacheDriver

VICTIM = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # 13 tokens: 3 full blocks of 4


def flood(share: float) -> tuple[int, int]:
    """The victim's prompt, then 12 distinct 36-token prompts of one token each from
    another tenant, then the victim's prompt again: (hit before, hit after)."""
    d = CacheDriver.make("hash", num_blocks=40, policy=CachePolicy(fair_cached_share=share))
    d.add(VICTIM, 4, "t:v", fairness_key="t:v")
    d.run()
    d.add(VICTIM, 4, "t:v", fairness_key="t:v")
    d.run()
    warm = d.hit_log[-1][1]
    for i in range(12):
        d.add([1000 + i, *range(100 + 40 * i, 135 + 40 * i)], 1, "t:a", fairness_key="t:a")
        d.run()
    d.add(VICTIM, 4, "t:v", fairness_key="t:v")
    d.run()
    d.assert_clean()
    return warm, d.hit_log[-1][1]


def test_a_flood_keeps_a_quiet_tenants_prefix_with_the_default_floor() -> None:
    warm, after = flood(CacheConfig().fair_cached_share)
    assert warm == 12
    assert after == 12


def test_without_the_floor_the_flood_evicts_it() -> None:
    """What the default prevents: with the share at 0 the same flood wipes the prefix."""
    warm, after = flood(0.0)
    assert warm == 12
    assert after == 0


def test_a_tenants_many_domains_share_one_part() -> None:
    d = CacheDriver.make("hash", num_blocks=40, policy=CachePolicy(fair_cached_share=0.2))
    for k in range(6):  # six keys of tenant x, each caching 3 blocks
        d.add([50 + k, *range(1, 13)], 1, f"t:x/k:{k}", fairness_key="t:x")
    d.add([99, *range(1, 13)], 1, "t:y", fairness_key="t:y")
    d.run()
    ledger = d.kv.ledger
    fair, idle_by_root = ledger.fair_floors()
    assert fair == int(0.2 * 40 / 2)  # two tenants cache blocks, whatever x's domain count
    assert idle_by_root["t:x"] == 18
    # y may take everything of x above x's one part, and nothing of x below it.
    assert ledger.evictable_for("t:y") == idle_by_root["t:y"] + 18 - fair
    # x's own domains are not protected from each other by the tenant floor.
    assert ledger.evictable_for("t:x/k:0") == 18 + max(0, idle_by_root["t:y"] - fair)
    d.assert_clean()
