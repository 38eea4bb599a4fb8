"""validate_request's token check: the fast path refuses exactly what the per-token check does."""

from __future__ import annotations

import enum

import numpy as np
import pytest

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from engine.validation import validate_request

VOCAB = 100


class Color(enum.IntEnum):
    RED = 3


def _validate(ids: list[object]) -> int:
    return validate_request(
        ids,  # type: ignore[arg-type]
        SamplingParams(max_tokens=4),
        vocab_size=VOCAB,
        max_model_len=64,
        pool_tokens=1000,
        max_n=4,
        max_tokens_limit=None,
    )


@pytest.mark.parametrize(
    "ids",
    [[0], [VOCAB - 1], [0, 50, VOCAB - 1], [Color.RED, 4], list(range(VOCAB))[:40]],
)
def test_in_vocabulary_ints_pass(ids: list[object]) -> None:
    assert _validate(ids) == 4


@pytest.mark.parametrize(
    ("ids", "bad"),
    [
        ([1, VOCAB], 1),
        ([-1, 5], 0),
        ([5, 10**30], 1),
        ([1, True], 1),
        ([False], 0),
        ([1, 2.0], 1),
        ([1, "7"], 1),
        ([1, None], 1),
        ([np.int64(3)], 0),  # not a Python int
        ([Color.RED, -5, 200], 1),  # the first bad token is named
        ([3, 200, -5], 1),
    ],
)
def test_bad_tokens_are_refused_and_the_first_is_named(ids: list[object], bad: int) -> None:
    with pytest.raises(InvalidRequestError) as info:
        _validate(ids)
    assert info.value.param == "prompt"
    assert f"prompt token id {ids[bad]!r} is outside the vocabulary" in str(info.value)
