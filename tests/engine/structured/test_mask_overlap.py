"""Grammar masks are filled on the runner's worker thread while the step's forward runs
(issue 46, item 5: masks off the critical path where llguidance allows, since it drops
the GIL while it fills), and the tokens are those of filling them after the forward."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import llguidance.torch
import pytest

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec
from tests.utils.tiny_model import make_tiny_model_dir

PROMPT = [1, 17, 42, 99, 5]
SPECS = [
    StructuredSpec("regex", "[a-z]{3,8}-[0-9]{2,4}"),
    StructuredSpec("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}}}'),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny random model."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("mask_overlap"))


@pytest.fixture
def engine(folder: pathlib.Path) -> Iterator[LLMEngine]:
    eng = LLMEngine.from_options(str(folder), num_blocks=128, attention_backend="torch")
    eng.keep_finished = True
    yield eng
    eng.grammars.shutdown()


def _outputs(engine: LLMEngine) -> list[list[int]]:
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, structured=SPECS[0]),
        SamplingParams(temperature=0.8, seed=5, max_tokens=12, structured=SPECS[1]),
        SamplingParams(temperature=0.0, max_tokens=12),
    ]
    ids = [engine.add_request(PROMPT, p) for p in params]
    while engine.has_unfinished():
        engine.step()
    return [list(engine.finished[i].to_output().outputs[0].token_ids) for i in ids]


def test_masks_are_filled_while_the_forward_runs(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step's forward waits until a mask of that step has been filled: it can only
    get it if the fill runs beside the forward (filled after it, the wait times out)."""
    sequential = _outputs(engine)
    filled = threading.Event()
    fill_threads: set[str] = set()
    waits: list[bool] = []
    real_fill = llguidance.torch.fill_next_token_bitmask
    real_forward = engine.runner._forward

    def fill(*args: Any) -> Any:
        fill_threads.add(threading.current_thread().name)
        result = real_fill(*args)
        filled.set()
        return result

    def forward(*args: Any) -> Any:
        structured = any(
            s.params.structured is not None and not s.is_finished
            for s in engine.scheduler.running
        )
        if structured:
            waits.append(filled.wait(timeout=10))
            filled.clear()
        return real_forward(*args)

    monkeypatch.setattr(llguidance.torch, "fill_next_token_bitmask", fill)
    monkeypatch.setattr(engine.runner, "_forward", forward)
    assert _outputs(engine) == sequential
    assert waits and all(waits), waits
    assert threading.current_thread().name not in fill_threads
