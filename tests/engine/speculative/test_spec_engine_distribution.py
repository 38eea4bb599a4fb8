"""Sampled speculative decoding through the whole engine keeps the target's distribution:
the tokens a verify step emits (accepted drafts, or the replacement drawn from the rest)
are distributed as the tokens the same engine samples without speculation.

The verifier's own chi-square tests (test_verify.py) check the rule on given logits;
this one checks the engine's plumbing around it on a tiny random-weight model: verify
rows' logits rows, their sampling rows (temperature), the generator draws and the
tokens taken. A constant proposer drafts the model's most likely token, so about a
fifth of the drafts are accepted and the rest rejected (both branches are exercised).
Seeded requests make the test deterministic.
"""

from __future__ import annotations

import pathlib
import random
from collections import Counter

import pytest

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tests.utils.tiny_model import make_tiny_model_dir

# A high temperature spreads this random model's next-token mass over several tokens.
TEMPERATURE = 3.0
# 1920 samples per engine, in waves the waiting queue (1024 sequences) takes.
WAVES, REQUESTS, N = 2, 60, 16
# 99.9th percentile of chi-square with 5 degrees of freedom: 6 categories, two samples.
CHI2_5_999 = 20.515


class Constant:
    """Drafts the same tokens for every sequence (deterministic, as the rule assumes)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, seqs: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        return {seq.seq_id: self.tokens[:k] for seq, k in seqs}

    def release(self, seq_id: str) -> None:
        """Nothing is kept per sequence."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_spec_dist"))


def _samples(
    model: pathlib.Path, prompt: list[int], draft: list[int] | None, seed_base: int
) -> tuple[list[tuple[int, ...]], LLMEngine]:
    """Three sampled tokens of WAVES x REQUESTS x N sequences, with `draft` proposed
    each step (None: no speculation)."""
    options: dict[str, object] = {"block_size": 8, "num_blocks": 2048}
    if draft is not None:
        options.update(
            speculative_method="ngram", speculative_max_batch=4096, num_speculative_tokens=2
        )
    engine = LLMEngine.from_options(str(model), **options)
    if draft is not None:
        assert engine.speculator is not None
        engine.speculator.proposer = Constant(draft)
    engine.keep_finished = True
    for wave in range(WAVES):
        for i in range(wave * REQUESTS, (wave + 1) * REQUESTS):
            params = SamplingParams(
                temperature=TEMPERATURE, max_tokens=3, ignore_eos=True, n=N, seed=seed_base + i
            )
            engine.add_request(
                EngineRequest(prompt_token_ids=tuple(prompt), params=params, request_id=f"r{i}")
            )
        while engine.has_unfinished():
            engine.step()
    outputs = [
        tuple(seq.output_token_ids) for state in engine.finished.values() for seq in state.seqs
    ]
    return outputs, engine


def _homogeneity(a: Counter[int], b: Counter[int], categories: list[int]) -> float:
    """Pearson's chi-square that two samples share one distribution over `categories`
    plus "anything else"."""
    rows = [[c[t] for t in categories] + [sum(c.values()) - sum(c[t] for t in categories)]
            for c in (a, b)]  # fmt: skip
    totals = [sum(r) for r in rows]
    columns = [rows[0][j] + rows[1][j] for j in range(len(rows[0]))]
    grand = sum(totals)
    stat = 0.0
    for i, row in enumerate(rows):
        for j, observed in enumerate(row):
            expected = totals[i] * columns[j] / grand
            if expected:
                stat += (observed - expected) ** 2 / expected
    return stat


def test_sampled_verify_steps_keep_the_target_distribution(tiny_model: pathlib.Path) -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(100, 5000) for _ in range(20)]
    plain, _ = _samples(tiny_model, prompt, None, seed_base=0)
    first = Counter(o[1] for o in plain)
    likely = first.most_common(1)[0][0]
    spec, engine = _samples(tiny_model, prompt, [likely, likely], seed_base=10_000)
    stats = engine.stats().spec_decode
    assert stats is not None and stats.num_drafts > 0
    # Both branches ran: some drafts accepted, most rejected and replaced.
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    for position in (1, 2):  # the second and third tokens come from verify steps
        a = Counter(o[position] for o in plain)
        b = Counter(o[position] for o in spec)
        categories = [t for t, _ in (a + b).most_common(5)]
        assert _homogeneity(a, b, categories) < CHI2_5_999, (
            position,
            a.most_common(5),
            b.most_common(5),
        )
