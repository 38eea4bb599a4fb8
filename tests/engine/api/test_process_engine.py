"""ProcessEngine: the engine loop in a child process behaves as AsyncEngine does.

Each test spawns one child (a few seconds: the child imports torch and builds the
tiny model), so the checks that can share a child do.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pathlib
import signal

import pytest

from engine import SamplingParams
from engine.errors import (
    EngineDeadError,
    EngineOverloadedError,
    InvalidRequestError,
)
from engine.fronts.process_engine import EngineStartError, ProcessEngine
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from tests.utils.engine_requests import make_request


def _tiny_factory(folder: pathlib.Path, **options: object) -> functools.partial[LLMEngine]:
    return functools.partial(
        LLMEngine.from_options, str(folder), num_blocks=64, attention_backend="torch", **options
    )


def _broken_factory() -> LLMEngine:
    raise RuntimeError("no weights here")


def test_streams_validation_abort_and_overload(tiny_model: pathlib.Path) -> None:
    engine = ProcessEngine(_tiny_factory(tiny_model, max_waiting=3))
    assert engine.pid is not None and engine.pid != os.getpid()
    tok = engine.tokenizer  # the child's tokenizer, received in its first message
    prompts = [tok.encode(p) for p in ("alpha beta", "gamma", "delta epsilon zeta")]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    offline = LLM(str(tiny_model), num_blocks=64, attention_backend="torch")
    expected = [o.outputs[0].token_ids for o in offline.generate(prompts, greedy)]

    async def collect(stream: object) -> list[int]:
        return [t async for ev in stream for d in ev.deltas for t in d.token_ids]  # type: ignore[attr-defined]

    async def main() -> None:
        await engine.start()
        try:
            # Refused in this process, before anything is sent.
            with pytest.raises(InvalidRequestError):
                engine.submit(make_request([1, engine.vocab_size], greedy))
            with pytest.raises(InvalidRequestError):
                engine.submit(make_request([1] * (engine.max_model_len + 1), greedy))

            streams = [engine.submit(make_request(p, greedy, cache_domain="d")) for p in prompts]
            got = await asyncio.gather(*(collect(s) for s in streams))
            assert got == expected

            # Events cross without their prompt; each stream puts its own back.
            stream = engine.submit(make_request(prompts[2], greedy, cache_domain="d"))
            events = [ev async for ev in stream]
            assert all(ev.prompt_token_ids == tuple(prompts[2]) for ev in events)

            # Abort mid-stream: the stream ends with "abort" and the blocks are free.
            long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
            stream = engine.submit(
                make_request(prompts[0], long, request_id="long", cache_domain="d")
            )
            first = await stream.__anext__()
            assert not first.finished
            await engine.abort("long")
            rest = [ev async for ev in stream]
            assert rest and rest[-1].finished
            assert rest[-1].deltas[-1].finish_reason == "abort"
            assert engine.stats().num_running == 0
            assert engine.stats().kv_cache_usage == 0.0
            await engine.abort("never-seen")  # a no-op

            # The waiting queue is bounded on this side: the 4th queued request is refused.
            burst = [engine.submit(make_request(p, long, cache_domain="d")) for p in prompts]
            with pytest.raises(EngineOverloadedError):
                engine.submit(make_request(prompts[0], long, cache_domain="d"))
            # ... but only for the tenant that filled it: another one, under its share of
            # the slots, is sent on (the engine takes a slot back from "d" if it must).
            other = engine.submit(
                make_request(prompts[1], greedy, cache_domain="e/k1", fairness_key="e")
            )
            assert await collect(other) == expected[1]
            for s in burst:
                await engine.abort(s.request_id)
            assert engine.stats().num_running + engine.stats().num_waiting == 0
        finally:
            await engine.shutdown()
        assert not engine._process.is_alive()
        with pytest.raises(EngineDeadError):
            engine.submit(make_request(prompts[0], greedy))

    asyncio.run(main())


def test_a_killed_engine_process_fails_live_requests_not_the_caller(
    tiny_model: pathlib.Path,
) -> None:
    engine = ProcessEngine(_tiny_factory(tiny_model))
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main() -> None:
        await engine.start()
        try:
            stream = engine.submit(make_request([1, 2, 3], params))
            await stream.__anext__()
            assert engine.pid is not None
            os.kill(engine.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass
            with pytest.raises(EngineDeadError):
                engine.submit(make_request([1, 2, 3], params))
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_a_factory_that_fails_raises_its_reason() -> None:
    with pytest.raises(EngineStartError, match="no weights here"):
        ProcessEngine(_broken_factory)


def _report_wait_policy() -> LLMEngine:
    raise RuntimeError(f"wait policy {os.environ.get('OMP_WAIT_POLICY')!r}")


def test_the_child_keeps_the_default_openmp_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A passive policy put every worker to sleep after each op of a step: 66 vs 41 ms ITL.
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(EngineStartError, match="wait policy None"):
        ProcessEngine(_report_wait_policy)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # an operator's own choice still goes
    with pytest.raises(EngineStartError, match="wait policy 'ACTIVE'"):
        ProcessEngine(_report_wait_policy)


def test_the_engine_process_exits_when_its_parent_goes(tiny_model: pathlib.Path) -> None:
    engine = ProcessEngine(_tiny_factory(tiny_model))
    engine._sock.close()  # what the child sees when the parent dies
    engine._process.join(30)
    assert engine._process.exitcode is not None
