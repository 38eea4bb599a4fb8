"""Grammar masks are off the step's critical path (issue 46, item 5): a step's masks
are filled on a worker thread while its forward runs, the mask of a sequence's next
token is filled ahead on threads of their own, and a sequence whose next mask is not
done yet sits the step out, so a grammar slow to mask holds only its own request. The
tokens are those of the same requests run on their own."""

from __future__ import annotations

import threading
from typing import Any

import llguidance.torch
import pytest

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec

PROMPT = [1, 17, 42, 99, 5]
SLOW = SamplingParams(
    temperature=0.8,
    seed=5,
    max_tokens=12,
    structured=StructuredSpec("regex", "[a-z]{3,8}-[0-9]{2,4}"),
)
PLAIN = [
    SamplingParams(temperature=0.0, max_tokens=12),
    SamplingParams(temperature=0.9, seed=3, max_tokens=12),
]


def _tokens(engine: LLMEngine, request_id: str) -> list[int]:
    return list(engine.finished[request_id].to_output().outputs[0].token_ids)


def _alone(engine: LLMEngine, params: SamplingParams) -> list[int]:
    request_id = engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=params))
    while engine.has_unfinished():
        engine.step()
    return _tokens(engine, request_id)


def test_a_slow_mask_holds_only_its_own_request(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = [_alone(engine, p) for p in (SLOW, *PLAIN)]
    release = threading.Event()
    fill_threads: set[str] = set()
    real_fill = llguidance.torch.fill_next_token_bitmask

    def fill(*args: Any) -> Any:
        name = threading.current_thread().name
        fill_threads.add(name)
        if name.startswith("mask-ahead"):  # every next-token mask takes "forever"
            assert release.wait(timeout=30)
        return real_fill(*args)

    monkeypatch.setattr(llguidance.torch, "fill_next_token_bitmask", fill)
    slow = engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=SLOW))
    plain = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=p)) for p in PLAIN
    ]
    slow_tokens_when_plain_done: int | None = None
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        engine.step()
        if slow_tokens_when_plain_done is None and all(r in engine.finished for r in plain):
            state = engine.requests[slow]
            slow_tokens_when_plain_done = len(state.seqs[0].output_token_ids)
            release.set()
    release.set()
    assert slow_tokens_when_plain_done == 1  # its first token, then it waited for its mask
    assert [_tokens(engine, r) for r in (slow, *plain)] == alone
    assert threading.current_thread().name not in fill_threads
    assert len(engine.runner.matchers) == 0
