"""Adapters through the engine fronts: load, use, refuse, unload over the inbox."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import pytest

from engine.errors import AdapterInUseError, AdapterNotFoundError, InvalidAdapterError
from engine.fronts.async_engine import AsyncEngine
from engine.fronts.process_engine import ProcessEngine
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tests.utils.lora_engine import OPTIONS, Adapters, make_engine, outputs, run_all

PROMPT = (5, 9, 300, 41, 7, 12, 88, 1000)
Front = AsyncEngine | ProcessEngine
LONG = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def _thread(adapters: Adapters) -> Front:
    return AsyncEngine(LLMEngine.from_options(str(adapters.model), **OPTIONS))


def _process(adapters: Adapters) -> Front:
    return ProcessEngine(functools.partial(LLMEngine.from_options, str(adapters.model), **OPTIONS))


def _expected(adapters: Adapters) -> list[int]:
    engine = make_engine(adapters.model)
    engine.load_adapter("r8", str(adapters.paths["r8"]))
    rid = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(list(PROMPT)), params=LONG, adapter="r8", cache=False)
    )
    run_all(engine)
    return outputs(engine, rid)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_thread, _process], ids=["thread", "process"])
def test_adapters_through_a_front(adapters: Adapters, make: Callable[[Adapters], Front]) -> None:
    expected = _expected(adapters)
    front = make(adapters)

    async def main() -> None:
        await front.start()
        try:
            request = EngineRequest(prompt_token_ids=PROMPT, params=LONG, adapter="r8", cache=False)
            with pytest.raises(AdapterNotFoundError):
                front.submit(request)
            with pytest.raises(InvalidAdapterError):
                await front.load_adapter("bad", str(adapters.model))  # a model, not an adapter
            info = await front.load_adapter("r8", str(adapters.paths["r8"]))
            assert info.rank == 8 and info.target_modules == ("q_proj", "v_proj")
            (listed,) = front.adapters()
            assert listed == info  # the load's answer is what the listing says
            assert listed.location == info.location == "host"  # read, not yet in a slot
            stream = front.submit(request)
            first = await stream.__anext__()
            assert [a.location for a in front.adapters()] == ["device"]
            tokens = [t for d in first.deltas for t in d.token_ids]
            assert not first.finished  # 24 tokens: it is still running
            with pytest.raises(AdapterInUseError):
                await front.unload_adapter("r8")
            async for event in stream:
                tokens.extend(t for d in event.deltas for t in d.token_ids)
            assert tokens == expected
            await front.unload_adapter("r8")
            assert front.adapters() == []
            with pytest.raises(AdapterNotFoundError):
                await front.unload_adapter("r8")
        finally:
            await front.shutdown()

    asyncio.run(main())
