"""A request is validated once: on the caller's side through AsyncEngine, in add_request otherwise."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

import engine.fronts.core_loop as core_loop_module
import engine.llm_engine as llm_engine_module
from engine import AsyncEngine, SamplingParams
from engine.engine_builder import build_config
from engine.errors import InvalidRequestError
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from tests.utils.engine_requests import make_request


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts validate_request calls made by LLMEngine and by the fronts' EngineInfo."""
    calls: list[int] = []
    real = llm_engine_module.validate_request

    def counting(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(llm_engine_module, "validate_request", counting)
    monkeypatch.setattr(core_loop_module, "validate_request", counting)
    return calls


def test_async_engine_validates_once_on_the_callers_side(
    tiny_model: pathlib.Path, counted: list[int]
) -> None:
    engine = AsyncEngine.from_options(str(tiny_model), num_blocks=128, max_waiting=8)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main() -> list[int]:
        await engine.start()
        try:
            with pytest.raises(InvalidRequestError):
                engine.submit(
                    make_request([1, 10**9], params)
                )  # still refused at once, before queueing
            prompt = [3, 4, 5]
            stream = engine.submit(make_request(prompt, params))
            prompt.append(10**9)  # the caller's list changing later changes nothing
            return [t async for ev in stream for d in ev.deltas for t in d.token_ids]
        finally:
            await engine.shutdown()

    tokens = asyncio.run(main())
    assert len(tokens) == 5
    assert len(counted) == 2  # the refused request and the served one, once each


def test_direct_add_request_still_validates(tiny_model: pathlib.Path, counted: list[int]) -> None:
    engine = LLMEngine(build_config(str(tiny_model), num_blocks=64))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(InvalidRequestError):
        engine.add_request(EngineRequest(prompt_token_ids=(1, -3), params=params))
    with pytest.raises(InvalidRequestError):
        engine.add_request(
            EngineRequest(prompt_token_ids=(1, 2), params=SamplingParams(max_tokens=10**6))
        )
    assert len(counted) == 2 and not engine.has_unfinished()


def test_validated_max_tokens_is_used_as_given(
    tiny_model: pathlib.Path, counted: list[int]
) -> None:
    config = build_config(str(tiny_model), num_blocks=64, max_model_len=128)
    engine = LLMEngine(config, keep_finished=True)
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    max_tokens = engine.validate([7, 8, 9], params)
    assert max_tokens == engine.max_model_len - 3
    request_id = engine.add_request(
        EngineRequest(prompt_token_ids=(7, 8, 9), params=params), validated_max_tokens=3
    )
    while engine.has_unfinished():
        engine.step()
    assert len(counted) == 1  # only the explicit validate()
    assert len(engine.finished.pop(request_id).to_output().outputs[0].token_ids) == 3
