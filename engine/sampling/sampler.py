"""The sampler: from one step's logits to one token per row (plus logprobs).

Per row, in this order:

    logits --(logit_bias, min_tokens, repetition, presence/frequency)--> adjusted
    adjusted --temperature 0--> argmax
    adjusted --/T, softmax, top-k, top-p, min-p--> probs --row's own draw--> token

Batch independence: a seeded row must pick the same token whatever shares
its batch. Every tensor op here works row by row (softmax, sort, cumsum), and
the only randomness is one float64 uniform per sampled row, drawn from that
row's own generator, turned into a token by inverse-CDF over the kept
probabilities. One draw per row (rather than V exponentials for the Gumbel
trick) costs nothing on the CPU at large batches, and float64 keeps tokens with
tiny probabilities reachable.

Truncation needs probabilities sorted; a full sort of [B, 49152] is the most
expensive step here, so rows first try a `torch.topk` prefix of
`candidate_width` tokens and fall back to the full sort only when their kept
set may not fit into it. Both paths give the same token for the same draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.logprobs import RowLogprobs, compute_logprobs
from engine.sampling.penalties import apply_all
from engine.sampling.row import SamplingError, SamplingRow
from engine.sampling.truncation import NO_TOP_K, fits_in_prefix, keep_sorted, top_k_tensor


@dataclass(frozen=True)
class SamplerOutput:
    """One chosen token per row, and per row its logprobs when they were asked for."""

    token_ids: list[int]
    logprobs: list[RowLogprobs | None]


class Sampler:
    """Turns float logits [B, V] into tokens, following each row's SamplingParams."""

    def __init__(self, *, candidate_width: int = 256) -> None:
        if candidate_width < 1:
            raise SamplingError(f"candidate_width must be at least 1, got {candidate_width}")
        self._candidate_width = candidate_width

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """Picks one token per row. `logits` is left untouched."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise SamplingError(
                f"logits of shape {tuple(logits.shape)} do not match {len(rows)} rows"
            )
        work = logits.detach().to(torch.float32, copy=True)
        apply_all(work, rows)
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        greedy = [i for i, row in enumerate(rows) if row.params.greedy]
        sampled = [i for i, row in enumerate(rows) if not row.params.greedy]
        if greedy:
            index = torch.tensor(greedy, device=logits.device)
            tokens[index] = work.index_select(0, index).argmax(dim=-1)
        if sampled:
            index = torch.tensor(sampled, device=logits.device)
            tokens[index] = self._sample_rows(
                work.index_select(0, index), [rows[i] for i in sampled]
            )
        logprobs = compute_logprobs(logits.detach(), tokens, rows)
        return SamplerOutput(token_ids=tokens.tolist(), logprobs=logprobs)

    def _sample_rows(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Token ids [R] for rows with temperature > 0."""
        device = logits.device
        vocab_size = logits.shape[-1]
        temperature = torch.tensor(
            [row.params.temperature for row in rows], dtype=logits.dtype, device=device
        )
        probs = torch.softmax(logits / temperature.unsqueeze(1), dim=-1)
        uniforms = _draw_uniforms(rows, device)
        top_k = top_k_tensor([row.params.top_k for row in rows], vocab_size, device)
        top_p = torch.tensor([row.params.top_p for row in rows], dtype=probs.dtype, device=device)
        min_p = torch.tensor([row.params.min_p for row in rows], dtype=probs.dtype, device=device)

        chosen = torch.empty(len(rows), dtype=torch.long, device=device)
        truncated = (top_k < NO_TOP_K) | (top_p < 1.0)
        plain = (~truncated).nonzero().squeeze(1)
        if plain.numel():
            chosen[plain] = _draw_plain(probs[plain], min_p[plain], uniforms[plain])
        cut = truncated.nonzero().squeeze(1)
        if cut.numel():
            chosen[cut] = self._draw_truncated(
                probs[cut], top_k[cut], top_p[cut], min_p[cut], uniforms[cut]
            )
        return chosen

    def _draw_truncated(
        self,
        probs: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        min_p: torch.Tensor,
        uniforms: torch.Tensor,
    ) -> torch.Tensor:
        """Token ids for rows with top-k or top-p: topk prefix first, full sort if needed."""
        width = min(self._candidate_width, probs.shape[-1])
        prefix, prefix_ids = probs.topk(width, dim=-1)
        fits = fits_in_prefix(prefix, top_k, top_p)
        chosen = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        inside = fits.nonzero().squeeze(1)
        if inside.numel():
            keep = keep_sorted(prefix[inside], top_k[inside], top_p[inside], min_p[inside])
            position = _inverse_cdf(prefix[inside] * keep, uniforms[inside])
            chosen[inside] = prefix_ids[inside].gather(1, position.unsqueeze(1)).squeeze(1)
        outside = (~fits).nonzero().squeeze(1)
        if outside.numel():
            ordered, order = probs[outside].sort(dim=-1, descending=True, stable=True)
            keep = keep_sorted(ordered, top_k[outside], top_p[outside], min_p[outside])
            position = _inverse_cdf(ordered * keep, uniforms[outside])
            chosen[outside] = order.gather(1, position.unsqueeze(1)).squeeze(1)
        return chosen


def _draw_uniforms(rows: Sequence[SamplingRow], device: torch.device) -> torch.Tensor:
    """One float64 uniform in [0, 1) per row, each from the row's own generator."""
    draws = []
    for row in rows:
        generator = row.generator
        if generator is None:
            raise SamplingError("a sampled row (temperature > 0) needs a generator")
        draw = torch.rand((), generator=generator, dtype=torch.float64, device=generator.device)
        draws.append(draw.to(device))
    return torch.stack(draws)


def _draw_plain(probs: torch.Tensor, min_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ids for rows without top-k/top-p, in vocabulary order (no sort needed)."""
    floor = min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
    return _inverse_cdf(probs * (probs >= floor), uniforms)


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Position [R] with P(j) proportional to weights[:, j], selected by uniforms [R].

    Zero-weight positions are never returned: the cumulative sum is flat over
    them, and rounding past the end is clamped to the last positive weight.
    """
    cumulative = weights.to(torch.float64).cumsum(dim=-1)
    target = (uniforms * cumulative[:, -1]).unsqueeze(1)
    position = torch.searchsorted(cumulative, target, right=True).squeeze(1)
    last_positive = (weights > 0).cumsum(dim=-1).argmax(dim=-1)
    return torch.minimum(position, last_positive)
