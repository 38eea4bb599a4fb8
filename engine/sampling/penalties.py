"""Logit adjustments that depend on a row's history: bias, min_tokens, penalties.

Each function edits `logits` ([B, V] float32) in place and touches only the
entries it must: the work per row is proportional to the row's token history,
never to the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

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


def apply_repetition_penalty(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """HF/vLLM repetition penalty over prompt and output tokens.

    For every token seen at least once, a positive logit is divided by the
    penalty and a negative one multiplied by it (so penalty > 1 always lowers it).
    """
    for i, row in enumerate(rows):
        penalty = row.params.repetition_penalty
        if penalty == 1.0:
            continue
        history = list(row.prompt_token_ids) + list(row.output_token_ids)
        if not history:
            continue
        seen = torch.unique(torch.tensor(history, device=logits.device))
        values = logits[i, seen]
        logits[i, seen] = torch.where(values > 0, values / penalty, values * penalty)


def apply_presence_frequency(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """OpenAI presence and frequency penalties over the output tokens only.

    logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0)
    """
    for i, row in enumerate(rows):
        presence = row.params.presence_penalty
        frequency = row.params.frequency_penalty
        if (presence == 0.0 and frequency == 0.0) or not row.output_token_ids:
            continue
        tokens = torch.tensor(list(row.output_token_ids), device=logits.device)
        seen, counts = torch.unique(tokens, return_counts=True)
        logits[i, seen] -= frequency * counts.to(logits.dtype) + presence


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


def apply_all(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Applies every history-dependent adjustment in the sampler's fixed order."""
    apply_logit_bias(logits, rows)
    apply_min_tokens(logits, rows)
    apply_repetition_penalty(logits, rows)
    apply_presence_frequency(logits, rows)
