"""The acceptance rule: greedy rows match one-token decoding, sampled rows follow p."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from engine.sampling.row import SamplingError, SamplingRow, make_generator
from engine.sampling_params import SamplingParams
from engine.speculative.verify import target_probs, verify_greedy, verify_sampled

VOCAB = 6


def test_greedy_accepts_the_drafts_that_match_the_argmax() -> None:
    assert verify_greedy([4, 2, 9, 1], [4, 2, 9]).emitted == (4, 2, 9, 1)
    verdict = verify_greedy([4, 2, 9, 1], [4, 3, 9])
    assert verdict.accepted == (4,)
    assert verdict.token == 2  # the target's own token where the draft went wrong
    assert verify_greedy([7, 2], [4]).emitted == (7,)


def test_greedy_checks_the_row_count() -> None:
    with pytest.raises(SamplingError):
        verify_greedy([1, 2], [1, 2])


def _row(seed: int, **params: float) -> SamplingRow:
    return SamplingRow(
        params=SamplingParams(temperature=params.pop("temperature", 1.0), **params),  # type: ignore[arg-type]
        generator=make_generator(seed, 0),
    )


def _chi_square(counts: Counter[int], probs: torch.Tensor, trials: int) -> float:
    stat = 0.0
    for token in range(probs.shape[0]):
        expected = float(probs[token]) * trials
        if expected > 0:
            stat += (counts[token] - expected) ** 2 / expected
        else:
            assert counts[token] == 0, f"token {token} has no mass but was drawn"
    return stat


# 99.9th percentile of chi-square with 5 degrees of freedom: a false alarm once in 1000 runs
# (the seeds are fixed, so the test is deterministic; the bound says the figure is sane).
CHI2_5_999 = 20.52


@pytest.mark.parametrize(
    "params",
    [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 4}, {"temperature": 1.3, "top_p": 0.8}],
)
def test_sampled_tokens_follow_the_target_distribution(params: dict[str, float]) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 1.5
    draft = [int(logits[0].argmax()), 2]  # a likely first draft and an arbitrary second
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    trials = 3000
    after_first = 0
    for seed in range(trials):
        verdict = verify_sampled(logits, draft, _row(seed, **params))
        emitted = verdict.emitted
        first[emitted[0]] += 1
        if emitted[0] == draft[0]:
            after_first += 1
            second[emitted[1]] += 1
    p = target_probs(logits, _row(0, **params))
    assert _chi_square(first, p[0], trials) < CHI2_5_999
    # Given the first draft was emitted, the next token follows row 1's distribution too.
    assert after_first > 300
    assert _chi_square(second, p[1], after_first) < CHI2_5_999


def test_the_rule_is_not_the_draft_copied() -> None:
    """A draft the target rates unlikely is mostly replaced (the test above can fail)."""
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0, 0.0, -5.0]] * 2)
    taken = sum(verify_sampled(logits, [5], _row(seed)).accepted == (5,) for seed in range(2000))
    assert taken < 20


def test_a_seeded_row_is_reproducible_and_counts_its_draws() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, VOCAB)
    a = verify_sampled(logits, [1, 2, 3], _row(42))
    b = verify_sampled(logits, [1, 2, 3], _row(42))
    assert a == b
    # One uniform per draft scored, one for the token drawn after them.
    assert a.draws == len(a.accepted) + 1 + (len(a.accepted) < 3)
