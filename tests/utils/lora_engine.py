"""Drives an LLMEngine on the tiny model with LoRA adapters: engine options, the adapters'
folders, stepping to the end, and reading outputs and logits back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

OPTIONS: dict[str, Any] = {
    "num_blocks": 96,
    "block_size": 4,
    "attention_backend": "torch",
    "max_model_len": 128,
}
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@dataclass(frozen=True)
class Adapters:
    """The model folder and its adapters by name."""

    model: Path
    paths: dict[str, Path]


def make_engine(model: Path, **options: Any) -> LLMEngine:
    """An engine on the tiny model, keeping finished requests."""
    return LLMEngine(_config(model, **options), keep_finished=True)


def _config(model: Path, **options: Any) -> Any:
    from engine.engine_builder import build_config

    return build_config(str(model), **{**OPTIONS, **options})


def run_all(engine: LLMEngine, each_step: Any = None) -> None:
    """Steps until every request finished; `each_step(engine)` runs after every step."""
    for _ in range(500):
        if not engine.has_unfinished():
            return
        engine.step()
        if each_step is not None:
            each_step(engine)
    raise AssertionError("requests did not finish")


def outputs(engine: LLMEngine, request_id: str) -> list[int]:
    """The finished request's first sample's tokens."""
    return list(engine.finished[request_id].seqs[0].output_token_ids)


def record_logits(engine: LLMEngine, log: list[torch.Tensor]) -> None:
    """Appends every step's fp32 logits rows to `log`."""
    model = engine.runner.model
    original = model.compute_logits

    def compute(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)
        log.append(logits.detach().clone())
        return logits

    model.compute_logits = compute  # type: ignore[method-assign]
