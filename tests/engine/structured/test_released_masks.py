"""Work a structured request leaves behind when it ends (issue 46, the soak item): the
mask of a sequence's next token is filled ahead on the table's threads, and a request
that ends meanwhile (aborted, failed, out of tokens elsewhere) must not leave that fill
queued: each could take up to a second of a core for an ambiguous grammar, for nobody,
and live sequences' masks would wait behind them."""

from __future__ import annotations

import threading
import time
from typing import Any

import llguidance.torch
import pytest

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.matchers import AHEAD_THREADS
from engine.structured.spec import StructuredSpec

PROMPT = [1, 17, 42, 99, 5]
REQUESTS = 6  # more than the ahead threads, so that some fills are queued, not running


def _params(seed: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.8,
        seed=seed,
        max_tokens=12,
        structured=StructuredSpec("regex", "[a-z]{3,8}-[0-9]{2,4}"),
    )


def test_aborted_requests_leave_no_mask_fill_queued(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    ahead_fills: list[int] = []  # one entry per ahead fill that ran
    real_fill = llguidance.torch.fill_next_token_bitmask

    def fill(*args: Any) -> Any:
        if threading.current_thread().name.startswith("mask-ahead"):
            ahead_fills.append(1)
            assert gate.wait(timeout=30)  # every ahead fill is slow until the gate opens
        return real_fill(*args)

    monkeypatch.setattr(llguidance.torch, "fill_next_token_bitmask", fill)
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=_params(seed)))
        for seed in range(REQUESTS)
    ]
    # Step until every request sampled its first token: each has a fill queued ahead.
    for _ in range(100):
        if all(engine.requests[r].seqs[0].num_output_tokens >= 1 for r in ids):
            break
        engine.step()
    table = engine.runner.matchers
    assert not any(table.ready(engine.requests[r].seqs[0]) for r in ids)
    # Each ahead thread is inside a fill (those cannot be stopped); the rest are queued.
    deadline = time.monotonic() + 30
    while len(ahead_fills) < AHEAD_THREADS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ahead_fills) == AHEAD_THREADS
    for request_id in ids:
        engine.abort(request_id)
    gate.set()
    assert table._ahead is not None
    table._ahead.shutdown(wait=True)  # every fill still queued has run (or was dropped)
    assert len(ahead_fills) == AHEAD_THREADS, "fills of aborted requests ran after they ended"
    assert len(table) == 0
