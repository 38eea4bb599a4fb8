"""Timing audit of the prefix cache (after Gu et al., ICML 2025, "Auditing Prompt Caching
in Language Model APIs"), on the real SmolLM2 model at the engine API.

A victim in domain A sends a random-letter prompt; a prober sends a prompt sharing
95% of it (the first differing token forced to differ), with max_tokens=1, and we
time the first token. Misses are fresh random prompts. Each trial caches one victim
prompt, then runs the three arms (same domain, another domain, a miss) once each in
shuffled order (blocked randomization: load drift on a shared machine hits every
arm alike). One-sided KS tests: the same-domain arm must be detected (the positive
control, proving the test has power); the cross-domain arm must not be, and it must
never report a cached token.

The prompt is the issue's ~1,000 tokens, which takes about a minute on two idle
cores; CLOISTER_AUDIT_TOKENS (and CLOISTER_AUDIT_TRIALS) shrink it for a loaded machine.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence

import pytest
from scipy.stats import ks_2samp

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams

TOKENS = int(os.environ.get("CLOISTER_AUDIT_TOKENS", "1000"))
TRIALS = int(os.environ.get("CLOISTER_AUDIT_TRIALS", "10"))
SHARED = 0.95
ONE = SamplingParams(max_tokens=1, temperature=0)


def letter_ids(engine: LLMEngine) -> list[int]:
    ids = []
    for c in "abcdefghijklmnopqrstuvwxyz":
        enc = engine.tokenizer.encode(" " + c)
        if len(enc) == 1:
            ids.append(enc[0])
    assert len(ids) >= 20
    return ids


def timed(engine: LLMEngine, ids: list[int], domain: str) -> tuple[float, int]:
    """Time to first token, and the cached tokens the request reported."""
    start = time.perf_counter()
    rid = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(ids), params=ONE, cache_domain=domain)
    )
    while True:
        for event in engine.step():
            if event.request_id == rid:
                ttft = time.perf_counter() - start
                while engine.has_unfinished():
                    engine.step()
                return ttft, event.num_cached_tokens


def prompt_makers(
    rng: random.Random, letters: list[int], tokens: int, prefix: Sequence[int] = ()
) -> tuple[Callable[[], list[int]], Callable[[list[int]], list[int]]]:
    """`fresh`, a new prompt of `prefix` and `tokens` random letters, and `probe_of`, a
    prompt sharing `prefix` and SHARED of a victim's letters (its first differing token
    forced to differ)."""

    def fresh() -> list[int]:
        return [*prefix, *(rng.choice(letters) for _ in range(tokens))]

    def probe_of(victim: list[int]) -> list[int]:
        k = len(prefix) + int(tokens * SHARED)
        differ = rng.choice([t for t in letters if t != victim[k]])
        return victim[:k] + [differ] + [rng.choice(letters) for _ in range(len(victim) - k - 1)]

    return fresh, probe_of


def assert_verdict(ttft: dict[str, list[float]], cached: dict[str, list[int]], tokens: int) -> None:
    """The audit's verdict on its arms: the same domain's hits are cached and detected
    (the test has power), another domain's are neither."""
    same = ks_2samp(ttft["same"], ttft["base"], alternative="greater")
    cross = ks_2samp(ttft["cross"], ttft["base"], alternative="greater")
    report = {k: [round(x, 3) for x in v] for k, v in ttft.items()}
    assert all(c >= int(tokens * SHARED) - 16 for c in cached["same"]), cached
    assert cached["cross"] == [0] * TRIALS and cached["base"] == [0] * TRIALS
    assert same.pvalue < 1e-3, (same, report)
    assert cross.pvalue > 1e-3, (cross, report)


def audit(
    engine: LLMEngine,
    rng: random.Random,
    fresh: Callable[[], list[int]],
    probe_of: Callable[[list[int]], list[int]],
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """TRIALS blocks of the three arms: time to first token and cached tokens, by arm.

    Each block caches one `fresh()` victim in "t:victim", then probes it from that
    domain ("same") and from a new one ("cross"), and sends a `fresh()` miss from a
    new one ("base"), in shuffled order. Whichever probe runs first caches its tail in
    its own domain only, so it changes nothing the other one could find."""
    ttft: dict[str, list[float]] = {"same": [], "cross": [], "base": []}
    cached: dict[str, list[int]] = {"same": [], "cross": [], "base": []}
    for trial in range(TRIALS):
        victim = fresh()
        timed(engine, victim, "t:victim")
        arms = ["same", "cross", "base"]
        rng.shuffle(arms)
        for arm in arms:
            probe = fresh() if arm == "base" else probe_of(victim)
            domain = "t:victim" if arm == "same" else f"t:prober-{arm}-{trial}"
            t, c = timed(engine, probe, domain)
            ttft[arm].append(t)
            cached[arm].append(c)
    return ttft, cached


@pytest.mark.slow
@pytest.mark.serial  # a timing test: alone on the machine
def test_cross_domain_prefix_is_untimeable_and_same_domain_is_detected() -> None:
    engine = LLMEngine.from_options(None, num_blocks=4 * TRIALS * (TOKENS // 16 + 2) + 64)
    rng = random.Random(1234)
    fresh, probe_of = prompt_makers(rng, letter_ids(engine), TOKENS)
    timed(engine, fresh(), "t:warmup")
    ttft, cached = audit(engine, rng, fresh, probe_of)
    assert_verdict(ttft, cached, TOKENS)
