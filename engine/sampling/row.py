"""One row of a sampling batch, and the per-sample random generator it carries."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.errors import EngineError
from engine.sampling_params import SamplingParams


class SamplingError(EngineError):
    """The sampler was called with inconsistent inputs (a caller bug, not a bad request)."""


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs to know about one row of the logits it is given.

    `generator` belongs to the caller (one per sample, kept across steps) so that a
    seeded sample's stream depends only on its own draws. Greedy rows never draw
    and may pass `None`. `suppress_eos` holds the token ids to mask while fewer than
    `params.min_tokens` output tokens exist; the caller fills it (EOS plus stop ids).
    `state_key` names the sequence across steps: the sampler then keeps its penalty
    counts (updated with new outputs only) until `Sampler.release(state_key)`; its
    `output_token_ids` must then only grow in place. Without one, each call
    counts the row's history afresh.
    """

    params: SamplingParams
    generator: torch.Generator | None
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    suppress_eos: frozenset[int] = field(default_factory=frozenset)
    state_key: str | None = None


def derive_seed(seed: int, sample_index: int) -> int:
    """A 63-bit seed for sample `sample_index` of a request seeded with `seed`.

    Hashing (rather than `seed + index`) keeps request seed 1 / sample 1 from
    sharing a stream with request seed 2 / sample 0.
    """
    # repr of a tuple of ints is unambiguous, so distinct pairs give distinct inputs.
    digest = hashlib.blake2b(repr((int(seed), int(sample_index))).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") & ((1 << 63) - 1)


def make_generator(
    seed: int | None, sample_index: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A generator for one sample: deterministic from (seed, sample_index), else random.

    Create it on the device that will hold the logits, so draws need no copy.
    """
    generator = torch.Generator(device=device)
    if seed is None:
        generator.manual_seed(secrets.randbits(63))
    else:
        generator.manual_seed(derive_seed(seed, sample_index))
    return generator
