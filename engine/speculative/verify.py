"""Accepting a prefix of draft tokens from one pass's logits (Leviathan et al. 2023).

A verify row of k drafts has k + 1 logits rows: row i is the target model's
distribution for the position of draft i, and row k the one after the last draft.

- Greedy: draft i is accepted while it is the argmax of row i; the token after
  the accepted drafts is the argmax of the next row. The output is exactly what
  decoding one token per step would give.
- Sampled: the proposers here are deterministic (the draft distribution q puts
  all its mass on the draft token d), so draft i is accepted with probability
  min(1, p(d) / q(d)) = p(d), p being row i's distribution after temperature,
  top-k, top-p and min-p. On a rejection the token is drawn from the residual
  max(0, p - q), which is p with d removed; after k acceptances the bonus token
  is drawn from row k. Every emitted token then follows p exactly, and a seeded
  request draws its uniforms from its own generator, so it is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.row import SamplingError, SamplingRow
from engine.sampling.truncation import allowed_mask, top_k_tensor


@dataclass(frozen=True)
class Verdict:
    """What one verify row emits: the accepted drafts, then one token of the target's."""

    accepted: tuple[int, ...]
    token: int
    draws: int = 0  # uniforms drawn from the row's generator (0 for greedy rows)

    @property
    def emitted(self) -> tuple[int, ...]:
        """Every token this row adds to the sequence, in order."""
        return (*self.accepted, self.token)


def verify_greedy(targets: Sequence[int], draft: Sequence[int]) -> Verdict:
    """The verdict for a greedy row whose logits rows have argmaxes `targets` (k + 1)."""
    if len(targets) != len(draft) + 1:
        raise SamplingError(f"{len(targets)} logits rows for {len(draft)} draft tokens")
    accepted = 0
    while accepted < len(draft) and draft[accepted] == targets[accepted]:
        accepted += 1
    return Verdict(tuple(draft[:accepted]), int(targets[accepted]))


def target_probs(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """Float32 [m, V] distributions the sampler draws a sampled row's tokens from."""
    params = row.params
    probs = torch.softmax(logits.to(torch.float32) / params.temperature, dim=-1)
    count, vocab = probs.shape
    top_k = top_k_tensor([params.top_k] * count, vocab, probs.device)
    top_p = torch.full((count,), params.top_p, dtype=probs.dtype, device=probs.device)
    min_p = torch.full((count,), params.min_p, dtype=probs.dtype, device=probs.device)
    if params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0:
        probs = probs * allowed_mask(probs, top_k, top_p, min_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def verify_sampled(logits: torch.Tensor, draft: Sequence[int], row: SamplingRow) -> Verdict:
    """The verdict for a sampled row: `logits` [k + 1, V], uniforms from `row.generator`."""
    if logits.shape[0] != len(draft) + 1:
        raise SamplingError(f"{logits.shape[0]} logits rows for {len(draft)} draft tokens")
    generator = row.generator
    if generator is None:
        raise SamplingError("a sampled row (temperature > 0) needs a generator")
    # float64 on the host: the accept test and the residual draw reach tiny masses.
    probs = target_probs(logits, row).to(torch.float64).cpu()
    draws = 0
    for i, token in enumerate(draft):
        u = float(torch.rand((), generator=generator, dtype=torch.float64, device=generator.device))
        draws += 1
        if u < float(probs[i, token]):
            continue
        residual = probs[i].clone()
        residual[token] = 0.0
        chosen = _draw(residual, generator)
        return Verdict(tuple(draft[:i]), chosen, draws + 1)
    return Verdict(tuple(draft), _draw(probs[len(draft)], generator), draws + 1)


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """A position with probability proportional to `weights` (float64, host), one uniform."""
    u = torch.rand((), generator=generator, dtype=torch.float64, device=generator.device)
    cumulative = weights.cumsum(dim=0)
    target = float(u) * float(cumulative[-1])
    position = int(
        torch.searchsorted(cumulative, torch.tensor([target], dtype=torch.float64), right=True)
    )
    position = min(position, weights.shape[0] - 1)
    if weights[position] <= 0:  # rounding past the end: the last position with mass
        position = int((weights > 0).nonzero()[-1])
    return position
