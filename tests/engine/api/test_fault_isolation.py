"""A request that makes a step fail is failed alone; every other request goes on unchanged.

The faults are injected (nobody knows the next real one): the model runner, the
sampler or the post-processing raises whenever one marked request is in the
batch, after that request has already produced a few tokens. The other requests
must finish with exactly the tokens they produce alone, in both engine modes, and
the cache, block tables and penalty state must be left as if nothing had happened.
"""

from __future__ import annotations

import asyncio
import functools
import pathlib
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from engine import AsyncEngine, SamplingParams
from engine.errors import EngineDeadError, RequestFailedError
from engine.fronts.process_engine import ProcessEngine
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.request_state import RequestState
from engine.scheduler.output import SchedulerOutput
from tests.utils.engine_requests import make_request
from tests.utils.faulty_engine import POISON_SEED, SECRET
from tests.utils.faulty_engine import faulty_engine as make_faulty_engine

OPTIONS: dict[str, Any] = {"num_blocks": 64, "attention_backend": "torch", "max_model_len": 128}

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# Rows that go through the sampler, penalty state and seeded draws.
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True)
PENALISED = SamplingParams(
    temperature=0, frequency_penalty=0.7, repetition_penalty=1.3, max_tokens=12, ignore_eos=True
)
GOOD: list[tuple[list[int], SamplingParams]] = [
    ([11, 12, 13, 14, 15], GREEDY),
    ([21, 22] * 20, GREEDY),  # several blocks, prefilled while the others decode
    ([31, 32, 33], SEEDED),
    ([41, 42, 43, 44], PENALISED),
    ([11, 12, 13, 14, 15, 16], SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=8)),
]


def poison(temperature: float = 0.0) -> SamplingParams:
    """The marked request: the injected fault fires once it has two output tokens."""
    return SamplingParams(temperature=temperature, seed=POISON_SEED, max_tokens=12, ignore_eos=True)


def faulty_engine(folder: str, where: str) -> LLMEngine:
    """A tiny engine whose runner or sampler raises on the poisoned request."""
    return make_faulty_engine(folder, where, **OPTIONS)


@pytest.fixture(scope="module")
def alone(tiny_model: pathlib.Path) -> list[list[list[int]]]:
    """Each good request's tokens (per sample) when it runs by itself on a fresh engine."""
    out = []
    for prompt, params in GOOD:
        llm = LLM(str(tiny_model), **OPTIONS)
        result = llm.generate([prompt], params)[0]
        out.append([list(c.token_ids) for c in result.outputs])
    return out


def _assert_clean(engine: LLMEngine) -> None:
    assert not engine.has_unfinished()
    assert engine.kv.pool.num_free == engine.kv.num_blocks
    engine.kv.check_integrity()
    assert engine.runner.block_table.num_live_rows == 0
    assert engine.runner.sampler.penalty_state.num_live_slots == 0
    assert not engine.runner._generators


def _run_to_end(engine: LLMEngine, ids: list[str]) -> dict[str, dict[int, list[int]]]:
    tokens: dict[str, dict[int, list[int]]] = {i: {} for i in ids}
    while engine.has_unfinished():
        for event in engine.step():
            for delta in event.deltas:
                tokens[event.request_id].setdefault(delta.index, []).extend(delta.token_ids)
    return tokens


def _as_lists(by_index: dict[int, list[int]]) -> list[list[int]]:
    return [by_index[i] for i in sorted(by_index)]


@pytest.mark.parametrize(
    ("where", "temperature"), [("runner", 0.0), ("sampler", 0.7), ("runner", 0.7)]
)
def test_the_poisoned_request_fails_alone(
    tiny_model: pathlib.Path, alone: list[list[list[int]]], where: str, temperature: float
) -> None:
    engine = faulty_engine(str(tiny_model), where)
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=sp, cache_domain="t1"))
        for p, sp in GOOD[:2]
    ]
    bad = engine.add_request(
        EngineRequest(prompt_token_ids=(7, 8, 9), params=poison(temperature), cache_domain="t2")
    )
    ids += [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=sp, cache_domain="t3"))
        for p, sp in GOOD[2:]
    ]
    tokens = _run_to_end(engine, [*ids, bad])
    failures = engine.take_failures()
    assert [rid for rid, _ in failures] == [bad]
    assert SECRET in str(failures[0][1])
    assert [_as_lists(tokens[i]) for i in ids] == alone
    assert len(tokens[bad].get(0, [])) == 2  # it ran until the fault hit it
    _assert_clean(engine)
    # And the engine serves on, from the cache the others left behind.
    again = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(GOOD[0][0]), params=GOOD[0][1], cache_domain="t1")
    )
    assert _as_lists(_run_to_end(engine, [again])[again]) == alone[0]
    _assert_clean(engine)


def test_a_fault_in_post_processing_fails_only_its_request(
    tiny_model: pathlib.Path, alone: list[list[list[int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = LLMEngine.from_options(str(tiny_model), **OPTIONS)
    real = RequestState.add_token

    def add_token(self: RequestState, seq: Any, token: Any, now: float) -> Any:
        if seq.params.seed == POISON_SEED and seq.num_output_tokens >= 3:
            raise UnicodeError(SECRET)
        return real(self, seq, token, now)

    monkeypatch.setattr(RequestState, "add_token", add_token)
    bad = engine.add_request(
        EngineRequest(prompt_token_ids=(7, 8, 9), params=poison(), cache_domain="t2")
    )
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=sp, cache_domain="t1"))
        for p, sp in GOOD
    ]
    tokens = _run_to_end(engine, [*ids, bad])
    assert [rid for rid, _ in engine.take_failures()] == [bad]
    assert [_as_lists(tokens[i]) for i in ids] == alone
    _assert_clean(engine)


def test_a_fault_that_needs_the_whole_batch_fails_nobody(
    tiny_model: pathlib.Path, alone: list[list[list[int]]]
) -> None:
    engine = LLMEngine.from_options(str(tiny_model), **OPTIONS)
    real = engine.runner.execute
    calls = {"n": 0}

    def flaky(output: SchedulerOutput) -> Any:
        calls["n"] += 1
        if calls["n"] == 3 and len(output.scheduled) > 1:  # e.g. a transient device error
            raise RuntimeError("out of memory")
        return real(output)

    engine.runner.execute = flaky  # type: ignore[method-assign]
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=sp)) for p, sp in GOOD
    ]
    tokens = _run_to_end(engine, ids)
    assert engine.take_failures() == []
    assert [_as_lists(tokens[i]) for i in ids] == alone
    _assert_clean(engine)


async def _serve_mixed(front: Any, expected: list[list[list[int]]], temperature: float) -> None:
    async def collect(stream: Any) -> list[list[int]]:
        by_index: dict[int, list[int]] = {}
        async for event in stream:
            for delta in event.deltas:
                by_index.setdefault(delta.index, []).extend(delta.token_ids)
        return _as_lists(by_index)

    await front.start()
    try:
        good = [
            front.submit(make_request(p, sp, cache_domain=f"t{i}"))
            for i, (p, sp) in enumerate(GOOD)
        ]
        bad = front.submit(make_request([7, 8, 9], poison(temperature), cache_domain="evil"))
        results = await asyncio.gather(
            *(collect(s) for s in good), collect(bad), return_exceptions=True
        )
        assert list(results[:-1]) == expected
        error = results[-1]
        assert isinstance(error, RequestFailedError)
        assert str(error) == RequestFailedError.MESSAGE
        assert SECRET not in repr(error)
        # The engine goes on serving.
        assert await collect(front.submit(make_request(*GOOD[0], cache_domain="t0"))) == expected[0]
        assert front.stats().num_running == 0
        assert front.stats().kv_cache_usage == 0.0
    finally:
        await front.shutdown()


@pytest.mark.parametrize("where", ["runner", "sampler"])
def test_thread_engine_isolates_the_poisoned_request(
    tiny_model: pathlib.Path, alone: list[list[list[int]]], where: str
) -> None:
    engine = faulty_engine(str(tiny_model), where)
    front = AsyncEngine(engine)
    asyncio.run(_serve_mixed(front, alone, 0.7 if where == "sampler" else 0.0))
    _assert_clean(engine)


def test_process_engine_isolates_the_poisoned_request(
    tiny_model: pathlib.Path, alone: list[list[list[int]]]
) -> None:
    factory: Callable[[], LLMEngine] = functools.partial(faulty_engine, str(tiny_model), "runner")
    asyncio.run(_serve_mixed(ProcessEngine(factory), alone, 0.0))


def test_the_failure_crosses_a_process_boundary_unchanged() -> None:
    # ProcessEngine pickles it into the parent; a failure to rebuild it hung every stream.
    error = pickle.loads(pickle.dumps(RequestFailedError()))
    assert isinstance(error, RequestFailedError) and str(error) == RequestFailedError.MESSAGE


def test_an_unreadable_report_ends_the_process_engine_instead_of_hanging(
    tiny_model: pathlib.Path,
) -> None:
    engine = ProcessEngine(functools.partial(LLMEngine.from_options, str(tiny_model), **OPTIONS))

    def unreadable(data: bytes) -> list[object]:
        raise pickle.UnpicklingError("a report the parent cannot rebuild")

    async def main() -> None:
        await engine.start()
        try:
            engine._decoder.feed = unreadable  # type: ignore[method-assign]
            stream = engine.submit(make_request([1, 2, 3], GREEDY))
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(stream.__anext__(), timeout=60)
            assert not engine.alive
        finally:
            await engine.shutdown()

    asyncio.run(main())
