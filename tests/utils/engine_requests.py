"""Builds `EngineRequest`s and `Sequence`s for engine tests in the shape of the old
keyword calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence as EngineSequence


def make_request(
    prompt_token_ids: Sequence[int], params: SamplingParams, **fields: Any
) -> EngineRequest:
    """`EngineRequest(prompt_token_ids=..., params=..., **fields)`; checked as it is built."""
    return EngineRequest(prompt_token_ids=tuple(prompt_token_ids), params=params, **fields)


def make_sequence(
    *,
    seq_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    max_tokens: int,
    request_id: str | None = None,
    index: int = 0,
    cache_domain: str = "default",
    adapter: str | None = None,
    use_cache: bool = True,
    fairness_key: str = "",
    priority: int = 0,
    batch: bool = False,
    **state: Any,
) -> EngineSequence:
    """A `Sequence` from the per-request fields it once copied, over a request built from
    them; `state` sets its own fields (`adapter_digest`, `arrival_time`, ...). The
    prompt list is the sequence's own, as given."""
    request = EngineRequest(
        prompt_token_ids=tuple(prompt_token_ids),
        params=params,
        request_id=seq_id if request_id is None else request_id,
        cache_domain=cache_domain,
        fairness_key=fairness_key,
        adapter=adapter,
        cache=use_cache,
        priority=priority,
        traffic_class="batch" if batch else "interactive",
    )
    return EngineSequence(
        seq_id=seq_id,
        request=request,
        index=index,
        prompt_token_ids=prompt_token_ids,
        max_tokens=max_tokens,
        **state,
    )
