"""Per-domain cache rules and pushed published prefixes (`KVCacheManager.apply_rules`).

Driven through the real scheduler and manager on the fake-KV driver, which checks
every hit against a reference model and every adopted block's contents.
"""

from __future__ import annotations

import pytest

from engine.kv_cache.cache_rules import CacheRules, DomainRule, match_rule
from engine.kv_cache.eviction import PUBLIC, CachePolicy
from tests.engine.prefix_cache.cache_driver import CacheDriver
from tests.utils.kv_inspect import block_domain, cached_block_ids

MODES = ["hash", "radix"]
PREFIX = list(range(1, 17))  # 4 blocks of 4


def _rules(
    *domains: tuple[str, DomainRule], published: tuple[tuple[int, ...], ...] = ()
) -> CacheRules:
    return CacheRules(domains=tuple(domains), published=published)


def _apply(d: CacheDriver, rules: CacheRules) -> None:
    """Pushes `rules` and keeps the driver's reference model in step."""
    d.kv.apply_rules(rules)
    d.published = list(rules.published)
    d.kv.check_integrity()


def _flood_then_return(d: CacheDriver, domain: str, flooder: str = "t:b") -> int:
    """`domain` caches PREFIX, `flooder` floods the pool; tokens `domain` gets back."""
    d.add([*PREFIX, 99], 1, domain)
    d.run()
    for i in range(30):  # unique prompts, 5 blocks each
        d.add([1000 + 20 * i + k for k in range(18)], 1, flooder)
    d.run()
    back = d.add([*PREFIX, 98], 1, domain)
    d.run()
    d.assert_clean()
    return back.num_cached_tokens


# -- floors ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("domain", ["t:a", "t:a/k:1", "t:a/k:1/u:9"])
def test_a_root_floor_protects_the_root_and_every_domain_below_it(mode: str, domain: str) -> None:
    d = CacheDriver.make(mode, num_blocks=24)
    assert _flood_then_return(d, domain) == 0  # no rule: the flood takes everything

    d = CacheDriver.make(mode, num_blocks=24)
    _apply(d, _rules(("t:a", DomainRule(floor_blocks=4))))
    assert _flood_then_return(d, domain) == 16


@pytest.mark.parametrize("mode", MODES)
def test_a_root_covers_only_whole_path_segments(mode: str) -> None:
    d = CacheDriver.make(mode, num_blocks=24)
    _apply(d, _rules(("t:a", DomainRule(floor_blocks=4))))
    assert _flood_then_return(d, "t:ab") == 0  # "t:ab" is not below "t:a"


@pytest.mark.parametrize("mode", MODES)
def test_the_longest_root_wins(mode: str) -> None:
    rules = _rules(
        ("t:a", DomainRule(floor_blocks=4)),
        ("t:a/k:1", DomainRule(floor_blocks=0)),
        ("t:a/k:2", DomainRule(floor_share=2 / 24)),  # 2 blocks of the pool of 24
    )
    outcomes = {}
    for domain in ("t:a/k:1", "t:a/k:1/u:1", "t:a/k:2", "t:a/k:3"):
        d = CacheDriver.make(mode, num_blocks=24)
        _apply(d, rules)
        outcomes[domain] = _flood_then_return(d, domain)
    assert outcomes == {"t:a/k:1": 0, "t:a/k:1/u:1": 0, "t:a/k:2": 8, "t:a/k:3": 16}


def test_a_rule_without_a_floor_keeps_the_default_floor() -> None:
    d = CacheDriver.make("hash", num_blocks=24, policy=CachePolicy(min_cached_blocks=4))
    _apply(d, _rules(("t:a", DomainRule(retention_ttl_s=1000.0))))
    assert d.kv.ledger.floor("t:a/k:1") == 4
    assert _flood_then_return(d, "t:a/k:1") == 16


def test_floor_is_the_larger_of_blocks_and_share() -> None:
    d = CacheDriver.make("hash", num_blocks=40)
    _apply(
        d,
        _rules(
            ("x", DomainRule(floor_blocks=3, floor_share=0.25)),
            ("y", DomainRule(floor_blocks=30, floor_share=0.25)),
        ),
    )
    assert d.kv.ledger.floor("x") == 10 and d.kv.ledger.floor("y/z") == 30
    assert d.kv.ledger.floor("w") == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_new_push_replaces_the_last_one(mode: str) -> None:
    d = CacheDriver.make(mode, num_blocks=24)
    _apply(d, _rules(("t:a", DomainRule(floor_blocks=4))))
    _apply(d, _rules(("t:c", DomainRule(floor_blocks=4))))
    assert _flood_then_return(d, "t:a") == 0


# -- retention -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_ttl_per_root_expires_only_that_roots_blocks(mode: str) -> None:
    d = CacheDriver.make(mode)
    _apply(d, _rules(("t:a", DomainRule(retention_ttl_s=5.0))))
    prompt = list(range(1, 14))
    for domain in ("t:a", "t:a/k:1", "t:b"):
        d.add(prompt, 1, domain)
    d.run()
    d.clock.now += 3  # younger than the TTL: every domain still hits
    early = [d.add(prompt, 1, dom) for dom in ("t:a", "t:b")]
    d.run()
    assert [s.num_cached_tokens for s in early] == [12, 12]
    d.clock.now += 10
    late = {dom: d.add(prompt, 1, dom) for dom in ("t:a", "t:a/k:1", "t:b")}
    d.run()
    assert {dom: s.num_cached_tokens for dom, s in late.items()} == {
        "t:a": 0,
        "t:a/k:1": 0,
        "t:b": 12,
    }
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_a_root_ttl_overrides_the_default_ttl(mode: str) -> None:
    d = CacheDriver.make(mode, policy=CachePolicy(retention_ttl_s=5.0))
    _apply(d, _rules(("t:b", DomainRule(retention_ttl_s=100.0))))
    prompt = list(range(1, 14))
    d.add(prompt, 1, "t:a")
    d.add(prompt, 1, "t:b/k:1")
    d.run()
    d.clock.now += 10
    a = d.add(prompt, 1, "t:a")
    b = d.add(prompt, 1, "t:b/k:1")
    d.run()
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 12)
    d.assert_clean()


# -- scrub -----------------------------------------------------------------------------


def _scrub_run(policy: CachePolicy, rules: CacheRules) -> dict[str, list[int]]:
    """Blocks scrubbed when they left each domain (a freed tail), then in a flood."""
    d = CacheDriver.make("hash", num_blocks=8, policy=policy)
    _apply(d, rules)
    out: dict[str, list[int]] = {}
    for domain in ("t:a/k:1", "t:b"):
        seq = d.add(list(range(1, 10)), 1, domain)  # 3 blocks: 2 cached, the tail freed
        d.run()
        cached = sorted(b for b in cached_block_ids(d.kv) if block_domain(d.kv, b) == domain)
        tail = d.kv.take_blocks_to_scrub()
        assert not set(tail) & cached_block_ids(d.kv)
        out[f"{domain} tail"] = tail
        out[f"{domain} cached"] = cached
        assert seq.num_cached_tokens == 0
    # 8 blocks of a third domain: both others' cached blocks must be evicted.
    d.add(list(range(50, 79)), 1, "t:c")
    d.run()
    out["flood"] = d.kv.take_blocks_to_scrub()
    d.assert_clean()
    return out


def test_scrub_per_root_zeroes_only_that_roots_freed_blocks() -> None:
    out = _scrub_run(CachePolicy(), _rules(("t:a", DomainRule(scrub_freed_blocks=True))))
    assert len(out["t:a/k:1 tail"]) == 1
    assert out["t:b tail"] == []
    # a's two cached blocks were scrubbed when evicted; b's and c's freed tail were not.
    assert len(out["t:a/k:1 cached"]) == 2 and len(out["t:b cached"]) == 2
    assert sorted(out["flood"]) == out["t:a/k:1 cached"]


def test_a_root_can_turn_the_default_scrub_off() -> None:
    out = _scrub_run(
        CachePolicy(scrub_freed_blocks=True), _rules(("t:b", DomainRule(scrub_freed_blocks=False)))
    )
    assert len(out["t:a/k:1 tail"]) == 1 and out["t:b tail"] == []
    # a's two evicted blocks and c's freed tail are scrubbed; b's two evicted ones are not.
    assert set(out["t:a/k:1 cached"]) <= set(out["flood"]) and len(out["flood"]) == 3


# -- published prefixes ----------------------------------------------------------------

SYSTEM = tuple(range(100, 110))  # 2 full blocks shared; tokens 108-109 stay per domain
TAIL = [1, 2, 3, 4, 5, 6]


def _public_blocks(d: CacheDriver) -> set[int]:
    return {b for b in cached_block_ids(d.kv) if block_domain(d.kv, b) == PUBLIC}


@pytest.mark.parametrize("mode", MODES)
def test_a_pushed_prefix_is_shared_and_the_rest_stays_private(mode: str) -> None:
    d = CacheDriver.make(mode)
    _apply(d, _rules(published=(SYSTEM,)))
    a = d.add([*SYSTEM, *TAIL], 1, "t:a")
    d.run()
    b = d.add([*SYSTEM, *TAIL], 1, "t:b")
    d.run()
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)  # not a's continuation
    again = d.add([*SYSTEM, *TAIL, 7], 1, "t:a")
    d.run()
    assert again.num_cached_tokens == 16
    assert len(_public_blocks(d)) == 2 and d.kv.num_pinned == 2
    assert d.kv.published_prefixes() == {SYSTEM}
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_withdrawal_stops_hits_at_once_and_frees_the_blocks(mode: str) -> None:
    d = CacheDriver.make(mode)
    _apply(d, _rules(published=(SYSTEM,)))
    d.add([*SYSTEM, *TAIL], 1, "t:a")
    d.run()
    public = _public_blocks(d)
    assert len(public) == 2
    _apply(d, _rules())
    # Nobody held them: evicted at once, nothing pinned.
    assert _public_blocks(d) == set() and d.kv.num_pinned == 0
    assert d.kv.pool.num_free == d.kv.num_blocks
    b = d.add([*SYSTEM, *TAIL], 1, "t:b")
    d.run()
    assert b.num_cached_tokens == 0
    # a's own prompt now lives under a's key from block 0: cached again, privately.
    a = d.add([*SYSTEM, *TAIL, 9], 1, "t:a")
    d.run()
    assert a.num_cached_tokens == 0
    a2 = d.add([*SYSTEM, *TAIL, 9], 1, "t:a")
    c = d.add([*SYSTEM, *TAIL, 9], 1, "t:c")
    d.run()
    assert (a2.num_cached_tokens, c.num_cached_tokens) == (16, 0)
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_a_sequence_running_over_a_withdrawn_prefix_finishes_correctly(mode: str) -> None:
    prompt = [*SYSTEM, *TAIL]

    def reference() -> list[int]:
        ref = CacheDriver.make(mode)
        _apply(ref, _rules(published=(SYSTEM,)))
        seq = ref.add(prompt, 12, "t:a")
        ref.run()
        return seq.output_token_ids

    d = CacheDriver.make(mode)
    _apply(d, _rules(published=(SYSTEM,)))
    d.add(prompt, 1, "t:a")
    d.run()
    running = d.add(prompt, 12, "t:b")
    for _ in range(3):
        d.step()
    assert running.num_cached_tokens == 8
    held = _public_blocks(d)
    assert held and held <= set(running.block_ids)
    _apply(d, _rules())
    # The running sequence keeps the blocks (unpinned); a new request cannot hit them.
    assert _public_blocks(d) == held and d.kv.num_pinned == 0
    late = d.add(prompt, 1, "t:c")
    while d.scheduler.has_unfinished():
        d.step()
        d.kv.check_integrity()
    assert late.num_cached_tokens == 0
    assert running.output_token_ids == reference()
    # Freed with the sequence: nothing public is left, nothing joined a tenant domain.
    assert _public_blocks(d) == set()
    assert all(block_domain(d.kv, b) != PUBLIC for b in cached_block_ids(d.kv))
    assert not held & {b for b in cached_block_ids(d.kv) if block_domain(d.kv, b) == "t:b"}
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_republished_while_held_is_pinned_again(mode: str) -> None:
    prompt = [*SYSTEM, *TAIL]
    d = CacheDriver.make(mode)
    _apply(d, _rules(published=(SYSTEM,)))
    running = d.add(prompt, 10, "t:a")
    for _ in range(3):
        d.step()
    _apply(d, _rules())
    _apply(d, _rules(published=(SYSTEM,)))
    assert d.kv.num_pinned == 2
    d.run()
    b = d.add(prompt, 1, "t:b")
    d.run()
    assert running.num_cached_tokens == 0 and b.num_cached_tokens == 8
    d.assert_clean()


@pytest.mark.parametrize("mode", MODES)
def test_withdrawing_a_longer_prefix_keeps_the_shorter_ones_blocks(mode: str) -> None:
    short = tuple(range(100, 108))  # 2 blocks
    long = tuple(range(100, 116))  # 4 blocks, starting with `short`
    d = CacheDriver.make(mode)
    _apply(d, _rules(published=(short, long)))
    d.add([*long, *TAIL], 1, "t:a")
    d.run()
    assert len(_public_blocks(d)) == 4
    _apply(d, _rules(published=(short,)))
    assert len(_public_blocks(d)) == 2 and d.kv.num_pinned == 2
    b = d.add([*long, *TAIL], 1, "t:b")
    d.run()
    assert b.num_cached_tokens == 8
    d.assert_clean()


def test_configured_prefixes_stay_published_whatever_is_pushed() -> None:
    d = CacheDriver.make("hash", published=(SYSTEM,))
    _apply(d, _rules())
    d.published = [SYSTEM]
    d.add([*SYSTEM, *TAIL], 1, "t:a")
    d.run()
    b = d.add([*SYSTEM, *TAIL], 1, "t:b")
    d.run()
    assert b.num_cached_tokens == 8
    d.assert_clean()


def test_a_waiting_plan_is_made_again_after_a_push() -> None:
    # The pool is full while the request waits: its lookup's plan must not outlive a push.
    d = CacheDriver.make("hash", num_blocks=6)
    _apply(d, _rules(published=(SYSTEM,)))
    big = d.add(list(range(500, 520)), 4, "t:z")  # 5 blocks + growth: holds the pool
    d.step()
    waiting = d.add([*SYSTEM, *TAIL], 1, "t:a")
    d.step()
    _apply(d, _rules())
    d.run()
    assert big.num_cached_tokens == 0 and waiting.num_cached_tokens == 0
    assert _public_blocks(d) == set()
    # Its blocks were cached under its own key from block 0, so its next request hits.
    again = d.add([*SYSTEM, *TAIL], 1, "t:a")
    d.run()
    assert again.num_cached_tokens == 12
    d.assert_clean()


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: DomainRule(floor_blocks=-1),
        lambda: DomainRule(floor_blocks=1.5),  # type: ignore[arg-type]
        lambda: DomainRule(floor_blocks=True),
        lambda: DomainRule(floor_share=-0.1),
        lambda: DomainRule(floor_share=1.5),
        lambda: DomainRule(floor_share=float("nan")),
        lambda: DomainRule(retention_ttl_s=0),
        lambda: DomainRule(retention_ttl_s=-5.0),
        lambda: DomainRule(retention_ttl_s=float("nan")),
        lambda: DomainRule(scrub_freed_blocks="yes"),  # type: ignore[arg-type]
        lambda: CacheRules(domains=(("", DomainRule()),)),
        lambda: CacheRules(domains=(("t:a b", DomainRule()),)),
        lambda: CacheRules(domains=(("t:a\n", DomainRule()),)),
        lambda: CacheRules(domains=(("t:a", DomainRule()), ("t:a", DomainRule()))),
        lambda: CacheRules(domains=(("t:a", 4),)),  # type: ignore[arg-type]
        lambda: CacheRules(domains=("t:a",)),  # type: ignore[arg-type]
        lambda: CacheRules(published=((),)),
        lambda: CacheRules(published=((1, -2),)),
        lambda: CacheRules(published=("abc",)),  # type: ignore[arg-type]
    ],
)
def test_bad_rules_raise_value_error(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_apply_rules_takes_cache_rules_only() -> None:
    d = CacheDriver.make("hash")
    with pytest.raises(TypeError):
        d.kv.apply_rules({"t:a": DomainRule()})  # type: ignore[arg-type]


def test_rules_are_frozen_tuples_and_match_by_path_segments() -> None:
    rules = CacheRules(domains=[("t:a", DomainRule(floor_blocks=1))], published=[[1, 2], [1, 2]])  # type: ignore[arg-type]
    assert rules.domains == (("t:a", DomainRule(floor_blocks=1)),)
    assert rules.published == ((1, 2),)
    hash(rules)
    m = rules.rule_map()
    assert match_rule(m, "t:a") is m["t:a"] and match_rule(m, "t:a/x/y") is m["t:a"]
    assert match_rule(m, "t:ab") is None and match_rule(m, "t") is None
