"""A Mistral-shaped model (a window on every layer) generating far past its window on a
pool smaller than any one sequence: each gives back the blocks behind its window, and
the tokens are transformers' own, with overlap scheduling, in turn and speculating (whose
verify steps roll back rejected drafts), cold and warm."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from tests.utils.hf_families import hf_greedy, load_reference, make_family_dir

WINDOW = 8
NEW_TOKENS = 70


MODES = {
    "overlap": {"overlap_scheduling": True, "overlap_min_forward_ms": 0.0},  # always launched
    "in-turn": {"overlap_scheduling": False},
    # Another model's drafts: mostly rejected, so verify steps roll back.
    "draft": {"speculative_method": "draft", "speculative_max_batch": 8},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_long_outputs_on_a_small_pool_match_transformers(tmp_path: Path, mode: str) -> None:
    folder = make_family_dir(tmp_path, "mistral", seed=2, sliding_window=WINDOW)
    options = dict(MODES[mode])
    if mode == "draft":
        options["speculative_model"] = str(make_family_dir(tmp_path, "mistral", seed=3))
    llm = LLM(
        str(folder), max_model_len=256, num_blocks=24, block_size=4, prefill_chunk_size=8,
        **options,
    )  # fmt: skip
    engine = llm.engine
    assert engine.kv.window == WINDOW
    pool = engine.capacity.num_tokens
    prompts = [list(range(900, 930)), list(range(40, 67))]
    assert all(len(p) + NEW_TOKENS > pool for p in prompts)  # none would fit whole
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    cold = llm.generate(prompts, params)
    warm = llm.generate(prompts, params)  # the first window's blocks are cached
    reference = load_reference(folder)
    for ids, c, w in zip(prompts, cold, warm, strict=True):
        assert c.outputs[0].token_ids == hf_greedy(reference, ids, steps=NEW_TOKENS)
        assert w.outputs[0].token_ids == c.outputs[0].token_ids
        assert w.num_cached_tokens == WINDOW
    # Each holds at most its window and two prefill chunks: both ran side by side.
    assert engine.scheduler.num_preemptions == 0
    assert engine.kv.pool.num_free == engine.kv.num_blocks
    if mode == "draft":
        spec = engine.stats().spec_decode
        assert spec is not None and spec.num_accepted_tokens < spec.num_draft_tokens
    engine.kv.check_integrity()
