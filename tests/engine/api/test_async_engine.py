"""AsyncEngine: streaming per request, abort, overload, and errors delivered to the right stream."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from engine import AsyncEngine, SamplingParams
from engine.errors import EngineOverloadedError, InvalidRequestError
from tests.utils.engine_requests import make_request


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


@pytest.fixture
def tiny_engine(tiny_model: pathlib.Path) -> AsyncEngine:
    # One engine per test: its thread delivers to the event loop it was started on.
    return AsyncEngine.from_options(str(tiny_model), num_blocks=128, max_waiting=8)


def test_streams_match_offline_and_interleave(tiny_engine: AsyncEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    async def main() -> list[list[int]]:
        await tiny_engine.start()
        prompts = [
            tiny_engine.tokenizer.encode(p) for p in ("alpha beta", "gamma", "delta epsilon zeta")
        ]
        streams = [tiny_engine.submit(make_request(p, params, cache_domain="d")) for p in prompts]

        async def collect(stream):  # noqa: ANN001, ANN202
            tokens: list[int] = []
            events = 0
            async for event in stream:
                events += 1
                for delta in event.deltas:
                    tokens.extend(delta.token_ids)
            assert events > 1  # it streamed, not one final blob
            return tokens

        return list(await asyncio.gather(*(collect(s) for s in streams)))

    got = run(main())
    assert all(len(t) == 10 for t in got)
    offline = tiny_engine.engine
    assert offline.kv.pool.num_free == offline.kv.num_blocks


def test_abort_mid_stream_frees_blocks(tiny_engine: AsyncEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main() -> str | None:
        await tiny_engine.start()
        stream = tiny_engine.submit(make_request([3] * 30, params, request_id="to-abort"))
        reason = None
        async for event in stream:
            if event.deltas and event.deltas[0].token_ids and reason is None:
                await tiny_engine.abort("to-abort")
                reason = "aborted"
            for delta in event.deltas:
                if delta.finish_reason:
                    reason = delta.finish_reason
        return reason

    assert run(main()) == "abort"
    assert tiny_engine.engine.kv.pool.num_free == tiny_engine.engine.kv.num_blocks


def test_bad_request_raises_at_submit(tiny_engine: AsyncEngine) -> None:
    async def main() -> None:
        await tiny_engine.start()
        with pytest.raises(InvalidRequestError):
            tiny_engine.submit(make_request([], SamplingParams()))

    run(main())


def test_overload_raises_at_submit(tiny_model: pathlib.Path) -> None:
    engine = AsyncEngine.from_options(str(tiny_model), num_blocks=32, max_waiting=2, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main() -> int:
        await engine.start()
        accepted = []
        refused = 0
        for _ in range(6):
            try:
                accepted.append(engine.submit(make_request([1, 2, 3], params)))
            except EngineOverloadedError:
                refused += 1
        for stream in accepted:
            async for _ in stream:
                pass
        await engine.shutdown()
        return refused

    assert run(main()) >= 1
