"""Token sampling: penalties, temperature, truncation, seeded draws, logprobs."""

from engine.sampling.logprobs import RowLogprobs
from engine.sampling.row import SamplingError, SamplingRow, derive_seed, make_generator
from engine.sampling.sampler import Sampler, SamplerOutput

__all__ = [
    "RowLogprobs",
    "Sampler",
    "SamplerOutput",
    "SamplingError",
    "SamplingRow",
    "derive_seed",
    "make_generator",
]
