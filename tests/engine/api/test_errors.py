"""Every bad input gets a typed error at once, and the engine keeps serving afterwards."""

from __future__ import annotations

import pathlib

import pytest

from engine import LLM, SamplingParams
from engine.engine_builder import build_config
from engine.errors import (
    ContextLengthExceededError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestTooLargeError,
)
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest

OK = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model: pathlib.Path) -> LLM:
    return LLM(str(tiny_model), num_blocks=64, max_model_len=128, max_n=4, max_tokens_limit=64)


def assert_still_serves(llm: LLM) -> None:
    out = llm.generate("still alive", OK)[0]
    assert len(out.outputs[0].token_ids) == 3
    assert llm.engine.kv.pool.num_free == llm.engine.kv.num_blocks
    llm.engine.kv.check_integrity()


@pytest.mark.parametrize(
    ("make", "error", "param"),
    [
        (lambda: ([], OK), InvalidRequestError, "prompt"),
        (lambda: ([1] * 200, OK), ContextLengthExceededError, "prompt"),
        (
            lambda: ([1] * 100, SamplingParams(max_tokens=60)),
            ContextLengthExceededError,
            "max_tokens",
        ),
        (lambda: ([1, 2], SamplingParams(max_tokens=100)), InvalidRequestError, "max_tokens"),
        (lambda: ([1, 2], SamplingParams(n=5)), InvalidRequestError, "n"),
        (lambda: ([1, 10**6], OK), InvalidRequestError, "prompt"),
        (lambda: ([1, -1], OK), InvalidRequestError, "prompt"),
        (
            lambda: ([1, 2], SamplingParams(stop_token_ids=[10**6])),
            InvalidRequestError,
            "stop_token_ids",
        ),
    ],
)
def test_bad_requests_raise_typed_errors(llm: LLM, make, error, param) -> None:
    prompt, params = make()
    with pytest.raises(error) as info:
        llm.generate([prompt], params)
    assert info.value.param == param
    assert_still_serves(llm)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"temperature": float("nan")}, "temperature"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
    ],
)
def test_bad_sampling_params_are_refused_at_construction(kwargs, param) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param


def test_request_larger_than_the_whole_pool_is_refused_not_queued(tiny_model: pathlib.Path) -> None:
    # 4 blocks x 16 tokens = 64 KV tokens; the context would allow 128.
    llm = LLM(str(tiny_model), num_blocks=4, max_model_len=128)
    with pytest.raises(RequestTooLargeError):
        llm.generate([[1] * 40], SamplingParams(max_tokens=40))
    assert not llm.engine.has_unfinished()
    assert_still_serves(llm)


def test_full_waiting_queue_refuses_at_once(tiny_model: pathlib.Path) -> None:
    engine = LLMEngine(build_config(str(tiny_model), num_blocks=64, max_waiting=2))
    engine.add_request(EngineRequest(prompt_token_ids=(1, 2, 3), params=OK))
    engine.add_request(EngineRequest(prompt_token_ids=(1, 2, 3), params=OK))
    with pytest.raises(EngineOverloadedError):
        engine.add_request(EngineRequest(prompt_token_ids=(1, 2, 3), params=OK))
    while engine.has_unfinished():
        engine.step()
    engine.add_request(EngineRequest(prompt_token_ids=(1, 2, 3), params=OK))  # room again


def test_more_samples_than_the_waiting_queue_holds_never_fit(tiny_model: pathlib.Path) -> None:
    engine = LLMEngine(build_config(str(tiny_model), num_blocks=64, max_waiting=2))
    with pytest.raises(RequestTooLargeError) as info:
        engine.add_request(
            EngineRequest(prompt_token_ids=(1, 2, 3), params=SamplingParams(n=3, max_tokens=2))
        )
    assert info.value.param == "n"
    engine.add_request(
        EngineRequest(prompt_token_ids=(1, 2, 3), params=SamplingParams(n=2, max_tokens=2))
    )  # exactly fits


def test_a_failing_request_frees_its_blocks_and_the_engine_goes_on(llm: LLM, monkeypatch) -> None:
    real = llm.engine.runner.execute
    bad = llm.tokenizer.encode("will fail")

    def faulty(output):  # noqa: ANN001, ANN202
        if any(item.seq.prompt_token_ids == bad for item in output.scheduled):
            raise RuntimeError("injected device fault")
        return real(output)

    monkeypatch.setattr(llm.engine.runner, "execute", faulty)
    real_run = llm.engine.runner.run

    def faulty_run(step, previous):  # noqa: ANN001, ANN202 (a step launched ahead)
        if any(seq.prompt_token_ids == bad for seq in step.seqs):
            raise RuntimeError("injected device fault")
        return real_run(step, previous)

    monkeypatch.setattr(llm.engine.runner, "run", faulty_run)
    # Offline, the call fails with the cause (its other prompt ran on and was dropped).
    with pytest.raises(RuntimeError, match="injected"):
        llm.generate(
            ["will fail", "does not fail"],
            SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        )
    assert not llm.engine.has_unfinished()
    assert_still_serves(llm)


def test_abort_frees_blocks_at_once(llm: LLM) -> None:
    engine = llm.engine
    rid = engine.add_request(
        EngineRequest(
            prompt_token_ids=tuple([5] * 40),
            params=SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
        )
    )
    engine.step()
    engine.step()
    assert engine.kv.pool.num_free < engine.kv.num_blocks
    event = engine.abort(rid)
    assert event is not None and event.finished
    assert event.deltas[0].finish_reason == "abort"
    assert engine.kv.pool.num_free == engine.kv.num_blocks
    assert not engine.has_unfinished()
    assert_still_serves(llm)
