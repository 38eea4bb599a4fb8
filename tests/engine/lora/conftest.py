"""A tiny model, synthetic PEFT adapters of ranks 4, 8 and 16, and an engine driver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.tiny_model import make_tiny_model_dir

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


@pytest.fixture(scope="package")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    root = tmp_path_factory.mktemp("lora")
    model = make_tiny_model_dir(root, seed=7)
    paths = {
        "r4": make_peft_adapter(root / "r4", model, 4, 8, seed=1),
        "r8": make_peft_adapter(root / "r8", model, 8, 16, ("q_proj", "v_proj"), seed=2),
        "r16": make_peft_adapter(
            root / "r16", model, 16, 4, ("gate_proj", "up_proj", "down_proj"), 3, use_rslora=True
        ),
        "r8b": make_peft_adapter(root / "r8b", model, 8, 8, seed=4),
        "r4b": make_peft_adapter(root / "r4b", model, 4, 4, ("k_proj", "o_proj"), seed=5),
    }
    return Adapters(model, paths)


def make_engine(model: Path, **options: Any) -> LLMEngine:
    """An engine on the tiny model, keeping finished requests."""
    return LLMEngine(_config(model, **options), keep_finished=True)


def _config(model: Path, **options: Any) -> Any:
    from engine.llm_engine import build_config

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


@pytest.fixture
def logits_log() -> Iterator[list[torch.Tensor]]:
    yield []


def record_logits(engine: LLMEngine, log: list[torch.Tensor]) -> None:
    """Appends every step's fp32 logits rows to `log`."""
    model = engine.runner.model
    original = model.compute_logits

    def compute(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)
        log.append(logits.detach().clone())
        return logits

    model.compute_logits = compute  # type: ignore[method-assign]
