"""Logit adjustments that depend on a row's history: bias, min_tokens, penalties.

Each function edits `logits` ([B, V] float32) in place. Bias and min_tokens
touch only the entries they must. The penalties work on whole rows of the
vocabulary, batched: per-sequence token counts live in a `PenaltyState` that
each step updates with only the new tokens (see penalty_state.py), so a step
costs the host O(rows with a penalty), not O(their history).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling.penalty_state import PenaltyState
from engine.sampling.row import SamplingRow


def apply_logit_bias(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Adds each row's `logit_bias` values to its logits (OpenAI semantics)."""
    row_idx: list[int] = []
    tok_idx: list[int] = []
    values: list[float] = []
    for i, row in enumerate(rows):
        for token, bias in row.params.logit_bias:
            row_idx.append(i)
            tok_idx.append(token)
            values.append(bias)
    if not row_idx:
        return
    device = logits.device
    logits.index_put_(
        (torch.tensor(row_idx, device=device), torch.tensor(tok_idx, device=device)),
        torch.tensor(values, dtype=logits.dtype, device=device),
        accumulate=True,
    )


def apply_min_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Masks `suppress_eos` tokens to -inf in rows that produced fewer than min_tokens."""
    row_idx: list[int] = []
    tok_idx: list[int] = []
    for i, row in enumerate(rows):
        if row.suppress_eos and len(row.output_token_ids) < row.params.min_tokens:
            for token in row.suppress_eos:
                row_idx.append(i)
                tok_idx.append(token)
    if not row_idx:
        return
    device = logits.device
    logits[torch.tensor(row_idx, device=device), torch.tensor(tok_idx, device=device)] = float(
        "-inf"
    )


def apply_repetition_penalty(
    logits: torch.Tensor, rows: Sequence[SamplingRow], state: PenaltyState | None = None
) -> None:
    """HF/vLLM repetition penalty over prompt and output tokens.

    For every token seen at least once, a positive logit is divided by the
    penalty and a negative one multiplied by it (so penalty > 1 always lowers it).
    """
    _apply_penalties(logits, rows, state, repetition=True, presence_frequency=False)


def apply_presence_frequency(
    logits: torch.Tensor, rows: Sequence[SamplingRow], state: PenaltyState | None = None
) -> None:
    """OpenAI presence and frequency penalties over the output tokens only.

    logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0)
    """
    _apply_penalties(logits, rows, state, repetition=False, presence_frequency=True)


def _apply_penalties(
    logits: torch.Tensor,
    rows: Sequence[SamplingRow],
    state: PenaltyState | None,
    *,
    repetition: bool,
    presence_frequency: bool,
) -> None:
    """The asked-for penalties for the whole batch at once, from `state`'s count tables.

    Only rows that use a penalty are synced and touched. Without a `state` (a
    one-off call) the histories are counted into a throwaway one.
    """
    positions: list[int] = []
    uses_repetition: list[bool] = []
    for i, row in enumerate(rows):
        params = row.params
        rep = repetition and params.repetition_penalty != 1.0
        if rep or (presence_frequency and (params.presence_penalty or params.frequency_penalty)):
            positions.append(i)
            uses_repetition.append(rep)
    if not positions:
        return
    chosen = [rows[i] for i in positions]
    if state is None:
        state = PenaltyState(len(chosen))
    table = state.sync(chosen, uses_repetition, logits.shape[1], logits.device)
    device, dtype = logits.device, logits.dtype
    # Row gathers index with `[]`, not index_select: on the CPU the latter is
    # tens of times slower for [256, 49152] (2 s against 40 ms, torch 2.13).
    # In-place ops and `out=` where they are exact: each [P, V] temporary costs a pass
    # and, on the CPU, fresh pages.
    with torch.inference_mode():
        every_row = len(positions) == logits.shape[0]
        index = None if every_row else torch.tensor(positions, device=device)
        values = logits if index is None else logits[index]
        counts = table.counts[table.slots].to(dtype)  # a new tensor: ours to overwrite
        seen = counts > 0
        if any(uses_repetition):
            penalty = _column([row.params.repetition_penalty for row in chosen], values)
            assert table.prompt_seen is not None  # synced with a row that needs it
            # Rows without the penalty hold 1.0, which leaves their logits exactly as they are.
            in_history = table.prompt_seen[table.slots].logical_or_(seen)
            penalized = values / penalty
            torch.where(values > 0, penalized, values * penalty, out=penalized)
            torch.where(in_history, penalized, values, out=values)
        if presence_frequency:
            frequency = _column([row.params.frequency_penalty for row in chosen], values)
            presence = _column([row.params.presence_penalty for row in chosen], values)
            adjust = counts.mul_(frequency).add_(presence)
            # Unseen tokens subtract +0.0, which leaves every value (-0.0 and inf too) as it was.
            values.sub_(adjust.masked_fill_(seen.logical_not_(), 0.0))
        if index is not None:
            logits[index] = values


def _column(numbers: list[float], like: torch.Tensor) -> torch.Tensor:
    """[len(numbers), 1] tensor of `like`'s dtype and device, to broadcast over rows."""
    return torch.tensor(numbers, dtype=like.dtype, device=like.device).unsqueeze(1)


def needs_adjustment(rows: Sequence[SamplingRow]) -> bool:
    """True when some row's logits would be changed by `apply_all`."""
    for row in rows:
        params = row.params
        if params.logit_bias or params.repetition_penalty != 1.0:
            return True
        if row.suppress_eos and len(row.output_token_ids) < params.min_tokens:
            return True
        if row.output_token_ids and (params.presence_penalty or params.frequency_penalty):
            return True
    return False


def apply_all(
    logits: torch.Tensor, rows: Sequence[SamplingRow], state: PenaltyState | None = None
) -> None:
    """Applies every history-dependent adjustment in the sampler's fixed order.

    `state` keeps the penalties' per-sequence counts across calls (rows with a
    `state_key`); without it each call counts the histories afresh.
    """
    apply_logit_bias(logits, rows)
    apply_min_tokens(logits, rows)
    # One pass does both penalties, repetition first, as two separate passes would.
    _apply_penalties(logits, rows, state, repetition=True, presence_frequency=True)
