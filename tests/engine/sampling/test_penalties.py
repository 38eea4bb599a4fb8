"""Logit bias, min_tokens and the three penalties change exactly the right logits."""

from __future__ import annotations

import pytest
import torch

from engine.sampling.penalties import (
    apply_logit_bias,
    apply_min_tokens,
    apply_presence_frequency,
    apply_repetition_penalty,
    needs_adjustment,
)
from engine.sampling.row import SamplingRow
from engine.sampling_params import SamplingParams

BASE = [2.0, -1.0, 0.5, -3.0, 1.0, 0.0]


def _logits(rows: int = 1) -> torch.Tensor:
    return torch.tensor([BASE] * rows)


def _row(
    params: SamplingParams, prompt: list[int] = (), output: list[int] = (), **kw
) -> SamplingRow:  # type: ignore[assignment]
    return SamplingRow(params, None, prompt, output, **kw)


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = _logits()
    row = _row(SamplingParams(repetition_penalty=2.0), prompt=[0, 1], output=[1, 5])
    apply_repetition_penalty(logits, [row])
    assert logits[0].tolist() == [1.0, -2.0, 0.5, -3.0, 1.0, 0.0]


def test_repetition_penalty_one_is_a_no_op() -> None:
    logits = _logits()
    apply_repetition_penalty(logits, [_row(SamplingParams(), prompt=[0, 1, 2])])
    assert logits[0].tolist() == BASE


def test_presence_and_frequency_use_output_counts_only() -> None:
    logits = _logits()
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    # Token 3 appears only in the prompt: untouched. Token 0 twice, token 2 once.
    row = _row(params, prompt=[3, 3, 3], output=[0, 2, 0])
    apply_presence_frequency(logits, [row])
    expected = list(BASE)
    expected[0] -= 0.5 + 2 * 0.25
    expected[2] -= 0.5 + 1 * 0.25
    assert logits[0].tolist() == pytest.approx(expected)


def test_negative_presence_penalty_raises_seen_tokens() -> None:
    logits = _logits()
    apply_presence_frequency(logits, [_row(SamplingParams(presence_penalty=-1.0), output=[4])])
    assert logits[0, 4].item() == pytest.approx(2.0)
    assert logits[0].tolist()[:4] == BASE[:4]


def test_logit_bias_adds_per_row() -> None:
    logits = _logits(2)
    rows = [
        _row(SamplingParams(logit_bias={1: 5.0, 3: -2.0})),
        _row(SamplingParams()),
    ]
    apply_logit_bias(logits, rows)
    assert logits[0].tolist() == [2.0, 4.0, 0.5, -5.0, 1.0, 0.0]
    assert logits[1].tolist() == BASE


def test_min_tokens_masks_eos_until_enough_output() -> None:
    logits = _logits(3)
    params = SamplingParams(min_tokens=2)
    rows = [
        _row(params, output=[4], suppress_eos=frozenset({0, 2})),
        _row(params, output=[4, 4], suppress_eos=frozenset({0, 2})),
        _row(SamplingParams(), output=[], suppress_eos=frozenset({0})),
    ]
    apply_min_tokens(logits, rows)
    assert logits[0, 0].item() == float("-inf")
    assert logits[0, 2].item() == float("-inf")
    assert logits[0, [1, 3, 4, 5]].tolist() == [-1.0, -3.0, 1.0, 0.0]
    assert logits[1].tolist() == BASE
    assert logits[2].tolist() == BASE


def test_needs_adjustment_only_when_something_applies() -> None:
    assert not needs_adjustment([_row(SamplingParams(), prompt=[1], output=[2])])
    assert not needs_adjustment([_row(SamplingParams(presence_penalty=1.0), prompt=[1])])
    assert not needs_adjustment(
        [_row(SamplingParams(min_tokens=1), output=[3], suppress_eos=frozenset({0}))]
    )
    assert needs_adjustment([_row(SamplingParams(presence_penalty=1.0), output=[1])])
    assert needs_adjustment([_row(SamplingParams(repetition_penalty=1.2))])
    assert needs_adjustment([_row(SamplingParams(logit_bias={1: 1.0}))])
    assert needs_adjustment(
        [_row(SamplingParams(min_tokens=2), output=[3], suppress_eos=frozenset({0}))]
    )
