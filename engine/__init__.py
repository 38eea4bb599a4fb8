"""Cloister's inference engine: paged KV cache, continuous batching, torch + triton.

`from engine import LLM, SamplingParams` is the offline API; `AsyncEngine` streams
for servers. Heavy modules load on first use, so importing `engine.errors` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.fronts.async_engine import AsyncEngine
    from engine.llm import LLM
    from engine.request import EngineRequest
    from engine.sampling_params import SamplingParams

_EXPORTS = {
    "LLM": "engine.llm",
    "AsyncEngine": "engine.fronts.async_engine",
    "EngineRequest": "engine.request",
    "SamplingParams": "engine.sampling_params",
}

__all__ = ["LLM", "AsyncEngine", "EngineRequest", "SamplingParams"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
