"""The runner's device path on the CPU: bf16 end to end, one host copy per greedy step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from engine.engine_builder import build_config
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tests.engine.runner.factory import tiny_arch, tiny_engine, tiny_model

PROMPTS = [[5, 17, 33, 2, 9], [100, 7], list(range(40, 63)), [301, 302, 303, 304]]


def _engine(dtype: torch.dtype, **options: object) -> LLMEngine:
    arch = tiny_arch()
    model = tiny_model(arch, seed=1, dtype=dtype)
    base: dict[str, object] = {
        "dtype": dtype,
        "block_size": 4,
        "num_blocks": 64,
        "attention_backend": "torch",
    }
    return tiny_engine(arch, model, **(base | options))


def _greedy_tokens(engine: LLMEngine, params: SamplingParams) -> list[list[int]]:
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=params)) for p in PROMPTS
    ]
    while engine.has_unfinished():
        engine.step()
    return [list(engine.finished.pop(i).to_output().outputs[0].token_ids) for i in ids]


def test_bf16_engine_keeps_weights_and_kv_in_bf16_and_matches_fp32_greedy() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ref = _greedy_tokens(_engine(torch.float32), params)
    engine = _engine(torch.bfloat16)
    assert engine.config.model.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in engine.runner.model.parameters())
    assert all(kv.dtype == torch.bfloat16 for kv in engine.runner.kv_caches)
    got = _greedy_tokens(engine, params)
    assert all(len(t) == 6 and all(0 <= x < engine.vocab_size for x in t) for t in got)
    # bf16 rounding may flip a near-tie late on; the first steps must agree.
    assert [t[:3] for t in got] == [t[:3] for t in ref]


def test_bf16_dtype_given_as_a_string_is_resolved() -> None:
    config = build_config(None, dtype="bfloat16", device="cuda", gpu_memory_utilization=0.8)
    assert config.model.dtype == torch.bfloat16
    assert config.cache.gpu_memory_utilization == 0.8


def test_greedy_fast_path_matches_the_sampler() -> None:
    fast = _greedy_tokens(
        _engine(torch.float32), SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    )
    # Asking for logprobs sends the same rows through the full sampler.
    slow = _greedy_tokens(
        _engine(torch.float32),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=1),
    )
    assert fast == slow


_SYNC_METHODS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


@contextmanager
def _count_host_reads(engine: LLMEngine) -> Iterator[list[str]]:
    """Counts tensor-to-host conversions during `runner.execute`, outside attention.

    The attention backend is excluded: the triton backend reads nothing back, while
    the CPU reference (used here) may; everything else is the runner's own doing.
    """
    calls: list[str] = []
    active = [True]
    originals = {name: getattr(torch.Tensor, name) for name in _SYNC_METHODS}

    def wrap(name: str) -> Callable[..., Any]:
        original = originals[name]

        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if active[0]:
                calls.append(name)
            return original(self, *args, **kwargs)

        return counted

    backend = engine.runner.backend
    forward = backend.forward

    def quiet_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        active[0] = False
        try:
            return forward(*args, **kwargs)
        finally:
            active[0] = True

    try:
        for name in _SYNC_METHODS:
            setattr(torch.Tensor, name, wrap(name))
        backend.forward = quiet_forward  # type: ignore[method-assign]
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        backend.forward = forward  # type: ignore[method-assign]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_greedy_step_reads_the_device_once(phase: str) -> None:
    engine = _engine(torch.float32, overlap_scheduling=False)  # steps in turn: `execute`
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for prompt in PROMPTS:
        engine.add_request(EngineRequest(prompt_token_ids=tuple(prompt), params=params))
    if phase == "decode":
        engine.step()  # the whole prefill fits one step; from here every row decodes
    execute = engine.runner.execute
    seen: list[list[str]] = []

    def counting_execute(output: Any) -> Any:
        with _count_host_reads(engine) as calls:
            result = execute(output)
        seen.append(list(calls))
        assert len(output.scheduled) == len(PROMPTS)
        return result

    engine.runner.execute = counting_execute  # type: ignore[method-assign]
    engine.step()
    assert seen == [["tolist"]]


def test_a_greedy_step_launched_ahead_reads_the_device_once() -> None:
    """Overlap scheduling: a step's pending input tokens are filled from host values, so
    its run reads the device once too (the sampled tokens)."""
    engine = _engine(torch.float32, overlap_min_forward_ms=0.0)  # launched whatever it measures
    assert engine.overlap is not None
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for prompt in PROMPTS:
        engine.add_request(EngineRequest(prompt_token_ids=tuple(prompt), params=params))
    engine.step()  # launches the prefill
    run = engine.runner.run
    seen: list[list[str]] = []
    pending: list[int] = []

    def counting_run(step: Any, previous: Any) -> Any:
        with _count_host_reads(engine) as calls:
            result = run(step, previous)
        seen.append(list(calls))
        pending.append(len(step.inputs.pending))
        return result

    engine.runner.run = counting_run  # type: ignore[method-assign]
    engine.step()  # launches the first decode, whose every input token is pending
    engine.overlap.drain()
    assert pending == [len(PROMPTS)]
    assert seen == [["tolist"]]


def _host_reads_of_one_sampled_step(num_prompts: int) -> list[str]:
    engine = _engine(torch.float32, overlap_scheduling=False)  # steps in turn: `execute`
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=4, seed=7)
    for prompt in (PROMPTS * 4)[:num_prompts]:
        engine.add_request(EngineRequest(prompt_token_ids=tuple(prompt), params=params))
    engine.step()
    execute = engine.runner.execute
    seen: list[str] = []

    def counting_execute(output: Any) -> Any:
        with _count_host_reads(engine) as calls:
            result = execute(output)
        seen.extend(calls)
        return result

    engine.runner.execute = counting_execute  # type: ignore[method-assign]
    engine.step()
    return seen


def test_a_sampled_step_reads_the_device_a_fixed_number_of_times_not_per_row() -> None:
    small, large = _host_reads_of_one_sampled_step(2), _host_reads_of_one_sampled_step(8)
    assert small == large
    assert small.count("tolist") >= 1
