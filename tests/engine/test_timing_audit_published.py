"""The timing audit (test_timing_audit.py) again, with a published prefix in front of
every prompt: the published part is a hit for everyone, and the private part after it
must stay untimeable across domains while the same domain is still detected.

Same method, helpers and knobs (CLOISTER_AUDIT_TOKENS, CLOISTER_AUDIT_TRIALS) as the
plain audit; the prefix is pushed the way the gateway pushes it (`update_cache_rules`).
"""

from __future__ import annotations

import random

import pytest
from scipy.stats import ks_2samp

from engine.kv_cache.cache_rules import CacheRules
from engine.llm_engine import LLMEngine
from tests.engine.test_timing_audit import (
    SHARED,
    TOKENS,
    TRIALS,
    audit,
    letter_ids,
    prompt_makers,
    timed,
)

PUBLISHED = 64  # four full blocks, shared by every domain


@pytest.mark.slow
@pytest.mark.serial  # a timing test: alone on the machine
def test_private_part_after_a_published_prefix_is_untimeable_across_domains() -> None:
    engine = LLMEngine.from_options(
        None, num_blocks=4 * TRIALS * (TOKENS // 16 + 2) + PUBLISHED // 16 + 64
    )
    rng = random.Random(4321)
    letters = letter_ids(engine)
    published = [rng.choice(letters) for _ in range(PUBLISHED)]
    engine.update_cache_rules(CacheRules(published=(tuple(published),)))
    fresh, probe_of = prompt_makers(rng, letters, TOKENS, published)
    timed(engine, fresh(), "t:warmup")  # also computes the published blocks
    ttft, cached = audit(engine, rng, fresh, probe_of)

    same = ks_2samp(ttft["same"], ttft["base"], alternative="greater")
    cross = ks_2samp(ttft["cross"], ttft["base"], alternative="greater")
    report = {k: [round(x, 3) for x in v] for k, v in ttft.items()}
    assert all(c >= PUBLISHED + int(TOKENS * SHARED) - 16 for c in cached["same"]), cached
    # Every other domain gets the published part, exactly, and nothing of the victim's.
    assert cached["cross"] == [PUBLISHED] * TRIALS, cached
    assert cached["base"] == [PUBLISHED] * TRIALS, cached
    assert same.pvalue < 1e-3, (same, report)
    assert cross.pvalue > 1e-3, (cross, report)
