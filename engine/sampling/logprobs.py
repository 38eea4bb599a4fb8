"""Log-probabilities of the chosen tokens and their top alternatives.

They are computed from log_softmax of the *raw* model logits, before logit
bias, penalties, temperature and truncation (vLLM's default): they describe
the model, not the sampling recipe, and are comparable across requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling.row import SamplingRow

# (chosen token's logprob, [(token id, logprob), ...] highest first)
RowLogprobs = tuple[float, list[tuple[int, float]]]


def compute_logprobs(
    raw_logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[SamplingRow]
) -> list[RowLogprobs | None]:
    """Per row: None unless `params.logprobs` is set, else (chosen, top `logprobs`)."""
    result: list[RowLogprobs | None] = [None] * len(rows)
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return result
    index = torch.tensor(wanted, device=raw_logits.device)
    logprobs = torch.log_softmax(raw_logits[index].float(), dim=-1)
    chosen = logprobs.gather(1, token_ids.index_select(0, index).unsqueeze(1)).squeeze(1)
    chosen_list: list[float] = chosen.tolist()
    counts = [rows[i].params.logprobs or 0 for i in wanted]
    widest = min(max(counts), logprobs.shape[-1])
    top_values: list[list[float]] = [[] for _ in wanted]
    top_ids: list[list[int]] = [[] for _ in wanted]
    if widest > 0:
        values, ids = logprobs.topk(widest, dim=-1)  # sorted, highest first
        top_values = values.tolist()
        top_ids = ids.tolist()
    for slot, row_index in enumerate(wanted):
        count = counts[slot]
        top = list(zip(top_ids[slot][:count], top_values[slot][:count], strict=True))
        result[row_index] = (chosen_list[slot], top)
    return result
