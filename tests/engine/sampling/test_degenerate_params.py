"""Degenerate sampling values: refused with the parameter named, or given a defined meaning.

No value that passes validation may make the sampler raise (a raise fails the
request, and before fault isolation it failed every request of the step).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequestError
from engine.sampling import Sampler, SamplingRow, make_generator
from engine.sampling_params import SamplingParams

HUGE = [math.inf, -math.inf, math.nan, 1e300, -1e300, 10**30, -(10**30)]


@pytest.mark.parametrize("top_p", [1e-300, 1e-46, 5e-324, 1e-40, 1e-8])
def test_a_tiny_top_p_keeps_the_top_token(top_p: float) -> None:
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, top_p=top_p)
    rows = [SamplingRow(params, make_generator(3, i)) for i in range(4)]
    out = Sampler().sample(logits, rows)
    assert out.token_ids == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 1e-30, 9.9e-6])
def test_a_temperature_below_1e_5_is_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature, top_p=0.3, top_k=5)
    assert params.greedy
    logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(2))
    out = Sampler().sample(logits, [SamplingRow(params, make_generator(None, i)) for i in range(3)])
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert not SamplingParams(temperature=1e-5).greedy


@pytest.mark.parametrize(
    ("param", "values"),
    [
        ("temperature", [*HUGE, -1e-9, 101.0]),
        ("top_p", [*HUGE, 0.0, -1e-300, 1.0000001]),
        ("top_k", [10**30 * 1.0, True, -2, 1.5]),
        ("min_p", [*HUGE, -1e-9, 1.1]),
        ("presence_penalty", [*HUGE, 2.5]),
        ("frequency_penalty", [*HUGE, -2.5]),
        ("repetition_penalty", [*HUGE, 0.0, 1e-300, 1e-3, 101.0]),
        ("seed", [1 << 64, -(1 << 63) - 1, 10**30, 1.5, True]),
        ("n", [0, -1, True, 2.0]),
        ("max_tokens", [0, -5, 1.5, True]),
        ("min_tokens", [-1, 0.5]),
        ("logprobs", [-1, 21, 10**30, 1.0]),
        ("stop", [[""], ["x" * 5000], ["s"] * 17, [5]]),
        (
            "logit_bias",
            [
                {1: math.nan},
                {1: math.inf},
                {1: 101.0},
                ((1.5, 1.0),),
                dict.fromkeys(range(1025), 1),
            ],
        ),
        ("stop_token_ids", [list(range(1025))]),
    ],
)
def test_degenerate_values_are_refused_with_the_parameter_named(
    param: str, values: list[object]
) -> None:
    for value in values:
        with pytest.raises(InvalidRequestError) as info:
            SamplingParams(**{param: value})  # type: ignore[arg-type]
        assert info.value.param == param, value


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([1e-300, 5e-324, 1e-46, 1e-5, 9.99e-6, 1e308, -0.0]),
)
FIELDS = ["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty"]
FIELDS += ["repetition_penalty", "seed"]


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=NUMBERS, sampled=st.booleans())
def test_any_number_is_refused_or_sampled_without_error(
    field: str, value: float, sampled: bool
) -> None:
    base = {"temperature": 0.8} if sampled and field != "temperature" else {}
    try:
        params = SamplingParams(**{**base, field: value})  # type: ignore[arg-type]
    except InvalidRequestError as exc:
        assert exc.param == field
        return
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(0))
    rows = [
        SamplingRow(params, make_generator(params.seed, i), output_token_ids=[1, 2, 2])
        for i in range(2)
    ]
    out = Sampler().sample(logits, rows)
    assert all(0 <= t < 300 for t in out.token_ids)
