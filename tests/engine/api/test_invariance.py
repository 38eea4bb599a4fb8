"""Greedy outputs do not depend on batching, chunking, block size or preemption."""

from __future__ import annotations

import pathlib

from engine import LLM, SamplingParams
from tests.engine.api.conftest import PROMPTS

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
