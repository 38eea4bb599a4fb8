"""Cache rules pushed into a running engine: AsyncEngine (thread) and ProcessEngine (child).

A prefix published by `update_cache_rules` makes a second domain's request report
cached tokens; withdrawing it stops that at once; a dead engine refuses the push.
"""

from __future__ import annotations

import asyncio
import functools
import pathlib
from collections.abc import Callable

import pytest

from engine import AsyncEngine, SamplingParams
from engine.errors import EngineDeadError, KVQuotaExceededError
from engine.fronts.async_engine import EngineFront
from engine.fronts.core_loop import EngineLoop, UpdateCacheRules
from engine.fronts.process_engine import ProcessEngine
from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine.llm_engine import LLMEngine
from tests.utils.engine_requests import make_request

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
SYSTEM = tuple(range(40, 72))  # two whole blocks of 16


OPTIONS: dict[str, object] = {"num_blocks": 64, "attention_backend": "torch"}


Front = AsyncEngine | ProcessEngine


def _thread(folder: pathlib.Path) -> Front:
    return AsyncEngine(LLMEngine.from_options(str(folder), **OPTIONS))


def _process(folder: pathlib.Path) -> Front:
    return ProcessEngine(functools.partial(LLMEngine.from_options, str(folder), **OPTIONS))


async def _cached(front: EngineFront, tail: list[int], domain: str) -> tuple[int, list[int]]:
    """(cached tokens reported, tokens generated) for SYSTEM + tail in `domain`."""
    cached = -1
    tokens: list[int] = []
    async for event in front.submit(make_request([*SYSTEM, *tail], GREEDY, cache_domain=domain)):
        cached = event.num_cached_tokens
        tokens.extend(t for d in event.deltas for t in d.token_ids)
    return cached, tokens


@pytest.mark.slow
@pytest.mark.parametrize("make", [_thread, _process], ids=["thread", "process"])
def test_published_prefix_pushed_into_a_running_engine(
    tiny_model: pathlib.Path, make: Callable[[pathlib.Path], Front]
) -> None:
    front = make(tiny_model)

    async def main() -> None:
        await front.start()
        try:
            with pytest.raises(TypeError):
                await front.update_cache_rules({"published": [SYSTEM]})  # type: ignore[arg-type]
            # Before any push, another domain shares nothing.
            await _cached(front, [1, 2, 3], "t:a")
            before, _ = await _cached(front, [4, 5, 6], "t:b")
            assert before == 0

            rules = CacheRules(
                domains=(("t:a", DomainRule(floor_blocks=8, retention_ttl_s=600.0)),),
                published=(SYSTEM,),
            )
            await front.update_cache_rules(rules)
            first, out_first = await _cached(front, [1, 2, 3], "t:a")
            assert first == 0  # a's earlier blocks are under its own key, not the public one
            shared, out_shared = await _cached(front, [1, 2, 3], "t:c")
            assert shared == 32  # the two published blocks, computed by t:a's request
            assert out_shared == out_first  # same prompt, same greedy tokens off shared KV

            await front.update_cache_rules(CacheRules(domains=rules.domains))
            after, _ = await _cached(front, [1, 2, 3], "t:d")
            assert after == 0  # withdrawn: no new hit, at once
            assert front.stats().num_running == 0
        finally:
            await front.shutdown()
        with pytest.raises(EngineDeadError):
            await front.update_cache_rules(CacheRules())

    asyncio.run(main())


def test_the_engine_applies_pushed_rules_to_its_cache(tiny_model: pathlib.Path) -> None:
    engine = LLMEngine.from_options(str(tiny_model), num_blocks=64, attention_backend="torch")
    engine.update_cache_rules(
        CacheRules(domains=(("t:a", DomainRule(floor_share=0.25)),), published=(SYSTEM,))
    )
    assert engine.kv.ledger.floor("t:a/k:1") == 16
    assert engine.kv.published_prefixes() == {SYSTEM}
    engine.kv.check_integrity()


class _RulesOnlyEngine:
    """The part of LLMEngine the loop touches for rule pushes, recording them."""

    def __init__(self) -> None:
        self.applied: list[CacheRules] = []
        self.overlap = None  # no overlap stepper to hand early events

    def update_cache_rules(self, rules: CacheRules) -> None:
        if rules.domains and rules.domains[0][0] == "refuse":
            raise ValueError("refused")
        self.applied.append(rules)

    def has_unfinished(self) -> bool:
        return False

    def close(self) -> None:
        """Nothing to release (the loop closes its engine when it returns)."""


def test_the_loop_applies_each_push_in_order_and_skips_repeats() -> None:
    engine = _RulesOnlyEngine()
    loop = EngineLoop(engine, lambda report: None)  # type: ignore[arg-type]
    one = CacheRules(published=(SYSTEM,))
    two = CacheRules(domains=(("t:a", DomainRule(floor_blocks=1)),))
    bad = CacheRules(domains=(("refuse", DomainRule()),))
    for rules in (one, CacheRules(published=(SYSTEM,)), two, bad, two, one):
        loop.put(UpdateCacheRules(rules))
    assert loop._take_inbox([], [], []) is False
    # The repeat of `one` is skipped; the refused push leaves `two` in force.
    assert engine.applied == [one, two, one]


@pytest.mark.slow
@pytest.mark.parametrize("make", [_thread, _process], ids=["thread", "process"])
def test_a_pushed_kv_quota_refuses_a_request_that_can_never_fit_it_at_submit(
    tiny_model: pathlib.Path, make: Callable[[pathlib.Path], Front]
) -> None:
    """The front refuses at once (before a stream starts: a 400, not an in-band error);
    another tenant, and a request that fits, go on."""
    front = make(tiny_model)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    async def main() -> None:
        await front.start()
        try:
            quota = DomainRule(kv_quota_blocks=2)  # 32 tokens in blocks of 16
            await front.update_cache_rules(CacheRules(domains=(("t:a", quota),)))
            with pytest.raises(KVQuotaExceededError, match="quota of 2 blocks"):
                front.submit(make_request(list(range(1, 14)), params, fairness_key="t:a"))
            fits = [
                e async for e in front.submit(make_request([1, 2, 3], params, fairness_key="t:a"))
            ]
            assert sum(len(d.token_ids) for e in fits for d in e.deltas) == 20
            other = make_request(list(range(1, 14)), params, fairness_key="t:b")
            assert [e async for e in front.submit(other)][-1].finished
            await front.update_cache_rules(CacheRules())  # cleared: the same request runs
            again = make_request(list(range(1, 14)), params, fairness_key="t:a")
            assert [e async for e in front.submit(again)][-1].finished
            assert front.stats().num_preemptions == 0
        finally:
            await front.shutdown()

    asyncio.run(main())
