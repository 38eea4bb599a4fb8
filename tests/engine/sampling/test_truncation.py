"""Top-k, top-p and min-p keep exactly the expected tokens on hand-made probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sampling.truncation import NO_TOP_K, allowed_mask, fits_in_prefix, top_k_tensor

# Probabilities 0.5, 0.2, 0.15, 0.1, 0.05 placed out of vocabulary order.
PROBS = {3: 0.5, 0: 0.2, 4: 0.15, 1: 0.1, 2: 0.05}


def _probs() -> torch.Tensor:
    return torch.tensor([[PROBS[t] for t in range(5)]])


def _allowed(top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> set[int]:
    mask = allowed_mask(
        _probs(),
        top_k_tensor([top_k], 5, torch.device("cpu")),
        torch.tensor([top_p]),
        torch.tensor([min_p]),
    )
    return set(mask[0].nonzero().squeeze(1).tolist())


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {0, 1, 2, 3, 4}),
        ({"top_k": 1}, {3}),
        ({"top_k": 2}, {3, 0}),
        ({"top_k": 4}, {3, 0, 4, 1}),
        ({"top_p": 0.4}, {3}),
        ({"top_p": 0.6}, {3, 0}),
        ({"top_p": 0.75}, {3, 0, 4}),
        ({"top_p": 0.9}, {3, 0, 4, 1}),
        ({"min_p": 0.35}, {3, 0}),
        ({"min_p": 0.25}, {3, 0, 4}),
        ({"min_p": 1.0}, {3}),
        # top-p is measured on the top-k survivors renormalised:
        # top-3 -> .588, .235, .176: mass before the 3rd is .82 > .6 -> 2 kept.
        ({"top_k": 3, "top_p": 0.6}, {3, 0}),
        # top-2 -> .714, .286: mass before the 2nd is .714 > .6 -> 1 kept.
        ({"top_k": 2, "top_p": 0.6}, {3}),
        ({"top_p": 0.9, "min_p": 0.25}, {3, 0, 4}),
    ],
)
def test_allowed_sets(kwargs: dict[str, float], expected: set[int]) -> None:
    assert _allowed(**kwargs) == expected  # type: ignore[arg-type]


def test_top_k_values_outside_the_vocabulary_mean_off() -> None:
    assert top_k_tensor([0, -1, 5, 9, 3], 5, torch.device("cpu")).tolist() == [
        NO_TOP_K,
        NO_TOP_K,
        NO_TOP_K,
        NO_TOP_K,
        3,
    ]


def test_fits_in_prefix() -> None:
    prefix = torch.tensor([[0.5, 0.2], [0.5, 0.2], [0.5, 0.2], [0.5, 0.2]])
    top_k = torch.tensor([2, 3, NO_TOP_K, NO_TOP_K])
    top_p = torch.tensor([1.0, 1.0, 0.6, 0.8])
    assert fits_in_prefix(prefix, top_k, top_p).tolist() == [True, False, True, False]


def test_rows_are_independent() -> None:
    probs = torch.softmax(torch.tensor([[math.log(p) for p in PROBS.values()]] * 2), dim=-1)
    mask = allowed_mask(
        probs, torch.tensor([1, NO_TOP_K]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])
    )
    assert mask.sum(dim=-1).tolist() == [1, 5]
