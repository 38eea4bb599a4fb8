"""Per-sample generators: deterministic per (seed, index), random without a seed."""

from __future__ import annotations

import torch

from engine.sampling.row import derive_seed, make_generator


def _stream(generator: torch.Generator) -> list[float]:
    return torch.rand(8, generator=generator, dtype=torch.float64).tolist()


def test_same_seed_and_index_give_the_same_stream() -> None:
    assert _stream(make_generator(7, 0)) == _stream(make_generator(7, 0))


def test_sample_indices_get_distinct_streams() -> None:
    streams = [tuple(_stream(make_generator(7, index))) for index in range(4)]
    assert len(set(streams)) == 4


def test_seed_and_index_do_not_alias_by_addition() -> None:
    assert derive_seed(1, 1) != derive_seed(2, 0)
    assert derive_seed(1, 1) != derive_seed(0, 2)


def test_no_seed_is_not_reproducible() -> None:
    assert _stream(make_generator(None, 0)) != _stream(make_generator(None, 0))


def test_derived_seed_fits_manual_seed() -> None:
    for seed in (0, -5, 2**70, 123456789):
        value = derive_seed(seed, 3)
        assert 0 <= value < 2**63
