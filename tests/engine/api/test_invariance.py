"""Greedy outputs do not depend on batching, chunking, block size or preemption."""

from __future__ import annotations

import pathlib

from engine import LLM, SamplingParams
from engine.scheduler.output import SchedulerOutput
from engine.scheduler.step_budget import StepBudget

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen",
    "Hi",
    "A much longer prompt that goes on for a while so that it spans several KV blocks "
    "and needs more than one prefill chunk when the chunk size is small enough, which "
    "is exactly what the invariance tests want to exercise here.",
    "Emoji 🎉 and 中文 text",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def run(model: pathlib.Path, **options: object) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(model), **options)
    outs = llm.generate(PROMPTS, GREEDY)
    llm.engine.kv.check_integrity()
    assert llm.engine.kv.pool.num_free == llm.engine.kv.num_blocks
    return [o.outputs[0].token_ids for o in outs], llm


def test_batched_equals_one_by_one(tiny_model: pathlib.Path) -> None:
    batched, llm = run(tiny_model, num_blocks=256)
    singles = [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    assert batched == singles
    assert all(len(t) == 24 for t in batched)


def test_chunk_sizes_and_block_sizes_do_not_change_outputs(tiny_model: pathlib.Path) -> None:
    reference, _ = run(tiny_model, num_blocks=256)
    for options in (
        {"prefill_chunk_size": 16, "num_blocks": 256},
        {"prefill_chunk_size": 64, "num_blocks": 256},
        {"block_size": 8, "num_blocks": 512},
        {"block_size": 16, "num_blocks": 256, "max_num_batched_tokens": 32},
    ):
        got, _ = run(tiny_model, **options)
        assert got == reference, options


def test_preemption_keeps_outputs_identical(tiny_model: pathlib.Path) -> None:
    reference, _ = run(tiny_model, num_blocks=256)
    # 12 blocks of 8 tokens: the longest prompt plus output fits alone, not all at once.
    got, llm = run(tiny_model, num_blocks=12, block_size=8)
    assert llm.engine.scheduler.num_preemptions > 0
    assert got == reference


class CapOf16(StepBudget):
    """A budget whose cap is fixed, whatever the steps cost (on a tiny model the decodes'
    own floor would let every prompt in at once)."""

    def prefill_cap(self) -> int:
        return 16


def test_itl_budget_chunks_prompts_without_changing_outputs(tiny_model: pathlib.Path) -> None:
    reference, plain = run(tiny_model, num_blocks=256)
    assert plain.engine.stats().prefill_token_cap is None
    _, llm = run(tiny_model, itl_budget_ms=1e-3, num_blocks=256)
    scheduler = llm.engine.scheduler
    decode, per_token = scheduler.step_budget.estimates()  # the engine fed it its steps
    assert decode is not None and decode > 0 and per_token is not None and per_token > 0
    assert llm.engine.stats().prefill_token_cap == scheduler.step_budget.prefill_cap()
    scheduler.step_budget = CapOf16(1e-6, 2048)
    steps: list[int] = []  # prompt tokens per step
    schedule = scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        steps.append(sum(i.num_new_tokens for i in out.scheduled if i.num_new_tokens > 1))
        return out

    scheduler.schedule = recording  # type: ignore[method-assign]
    again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_cache=False)]
    assert again == reference
    assert max(steps) == 16
    assert len([p for p in steps if p]) >= sum(len(llm.tokenizer.encode(p)) for p in PROMPTS) // 16
