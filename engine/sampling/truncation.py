"""Top-k, top-p and min-p: which tokens a sampled row may still pick.

All three keep a prefix of the tokens sorted by probability (highest first),
so they are computed on sorted probabilities and return a mask in that order:

    sorted position:   0     1     2     3   ...   W-1
    top_k = 3          keep  keep  keep  -
    top_p = 0.8        keep while the mass *before* the position is < 0.8
    min_p = 0.1        keep while p >= 0.1 * p[0]

The top token is always kept. Order of application: top-k, then top-p over the
probabilities renormalised to the top-k survivors, then min-p (a ratio to the
top probability, so it ignores renormalisation).
"""

from __future__ import annotations

import torch

# top_k value meaning "no top-k": larger than any vocabulary.
NO_TOP_K = 1 << 62
_MASS_MARGIN = 1e-5


def keep_sorted(
    sorted_probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Mask [R, W] of the sorted positions that survive top-k, top-p and min-p.

    `sorted_probs` [R, W] is a descending prefix (W may be less than the
    vocabulary) of probabilities normalised over the whole vocabulary. `top_k`
    [R] long (NO_TOP_K when off); `top_p`, `min_p` [R] float. When top-k is on it
    must be <= W, so that the renormalisation sees every survivor; with top-k off
    the probabilities are used as they are, so a prefix gives the same answer as
    the full sort as long as the kept set fits into it (see `fits_in_prefix`).
    """
    width = sorted_probs.shape[-1]
    positions = torch.arange(width, device=sorted_probs.device)
    keep = positions.unsqueeze(0) < top_k.unsqueeze(1)
    k_on = (top_k < NO_TOP_K).unsqueeze(1)
    masked = sorted_probs * keep
    renormed = masked / masked.sum(dim=-1, keepdim=True)
    p_for_top_p = torch.where(k_on, renormed, sorted_probs)
    mass_before = p_for_top_p.cumsum(dim=-1) - p_for_top_p
    p_limit = top_p.unsqueeze(1)
    # top_p == 1 keeps everything even where float rounding puts the cumsum at 1.
    keep &= (mass_before < p_limit) | (p_limit >= 1.0)
    keep &= sorted_probs >= min_p.unsqueeze(1) * sorted_probs[:, :1]
    # Whatever the limits round to (a top_p of 1e-300 is 0 in float32), the top token
    # stays: an empty kept set has nothing to draw from.
    keep[:, :1] = True
    return keep


def fits_in_prefix(
    sorted_prefix: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Bool [R]: does the kept set of each row lie inside this sorted prefix?

    True when top-k is on and at most the prefix width, or when top-k is off and
    the prefix already holds `top_p` of the mass (the next token would be cut).
    """
    width = sorted_prefix.shape[-1]
    k_on = top_k < NO_TOP_K
    mass = sorted_prefix.cumsum(dim=-1)[:, -1]
    # The margin sends rows whose cut falls within rounding of the prefix end to
    # the exact full sort instead of trusting two differently rounded sums.
    return torch.where(k_on, top_k <= width, mass >= top_p + _MASS_MARGIN)


def allowed_mask(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Bool [R, V] in vocabulary order: the tokens each row may pick (one full sort)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    keep_in_order = keep_sorted(sorted_probs, top_k, top_p, min_p)
    mask = torch.zeros_like(keep_in_order)
    mask.scatter_(-1, order, keep_in_order)
    return mask


def top_k_tensor(values: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """Long [R] of top-k values with 0, -1 and >= vocab_size mapped to NO_TOP_K."""
    cleaned = [k if 0 < k < vocab_size else NO_TOP_K for k in values]
    return torch.tensor(cleaned, dtype=torch.long, device=device)
