"""The timing audit (tests/engine/test_timing_audit.py's method) with the victim's prompt
in the host tier (L2) instead of the device pool.

The device pool holds about one prompt; after the victim's prompt is cached, a filler
domain's prompt evicts it from the pool, so it lives in L2 only. Then the three arms
run in shuffled order: the same domain (must be detected: its blocks load back from
L2), another domain sharing 95% of the prompt (must be indistinguishable from a miss,
and never report a cached token), and a fresh miss.
"""

from __future__ import annotations

import random

import pytest

from engine.llm_engine import LLMEngine
from tests.engine import test_timing_audit as audit
from tests.engine.test_timing_audit import (
    TRIALS,
    assert_verdict,
    letter_ids,
    prompt_makers,
    timed,
)

# Half the device audit's prompt (at most): a load from L2 against a 512-token prefill is
# still a wide gap to detect, and the suite keeps its time budget.
TOKENS = min(audit.TOKENS, 512)


@pytest.mark.slow
@pytest.mark.serial  # a timing test: alone on the machine
def test_cross_domain_l2_hit_is_untimeable_and_same_domain_is_detected() -> None:
    prompt_blocks = TOKENS // 16 + 2
    # Five tenants write down (warm-up, victim, filler, two probers); each may keep two
    # prompts against the others. SmolLM2-135M in fp32: 46,080 bytes a token.
    host_slots = 5 * 2 * prompt_blocks
    engine = LLMEngine.from_options(
        None, num_blocks=prompt_blocks + 2, kv_host_bytes=host_slots * 16 * 46_080
    )
    assert engine.kv.tier is not None
    assert engine.kv.tier.stats().capacity_blocks == host_slots
    rng = random.Random(4321)
    fresh, probe_of = prompt_makers(rng, letter_ids(engine), TOKENS)
    timed(engine, fresh(), "t:warmup")
    ttft: dict[str, list[float]] = {"same": [], "cross": [], "base": []}
    cached: dict[str, list[int]] = {"same": [], "cross": [], "base": []}
    for _trial in range(TRIALS):
        victim = fresh()
        timed(engine, victim, "t:victim")
        loads = engine.kv.tier.stats().loads
        arms = ["same", "cross", "base"]
        rng.shuffle(arms)
        for arm in arms:
            # Before each arm: the victim's blocks leave the pool for L2.
            timed(engine, fresh(), "t:filler")
            probe = fresh() if arm == "base" else probe_of(victim)
            # One prober domain per arm: each trial's victim is new, so a prober never
            # finds its own earlier probes.
            domain = "t:victim" if arm == "same" else f"t:prober-{arm}"
            t, c = timed(engine, probe, domain)
            ttft[arm].append(t)
            cached[arm].append(c)
        assert engine.kv.tier.stats().loads > loads  # the same arm's hit came from L2
    assert_verdict(ttft, cached, TOKENS)
    engine.kv.check_integrity()
