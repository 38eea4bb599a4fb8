"""Builds `EngineRequest`s for engine tests in the shape of the old keyword call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.request import EngineRequest
from engine.sampling_params import SamplingParams


def make_request(
    prompt_token_ids: Sequence[int], params: SamplingParams, **fields: Any
) -> EngineRequest:
    """`EngineRequest(prompt_token_ids=..., params=..., **fields)`; checked as it is built."""
    return EngineRequest(prompt_token_ids=tuple(prompt_token_ids), params=params, **fields)
