"""The prefix cache at the engine API on a tiny random-weight model."""

from __future__ import annotations

import pathlib

import pytest
import torch

from engine import LLM, SamplingParams
from tests.utils.kv_inspect import block_domain, cached_block_ids
from tests.utils.tiny_model import make_tiny_model_dir

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SYSTEM = "You are a helpful assistant. Answer briefly and precisely, in plain words. " * 3


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_cache"))


def turns(llm: LLM, domain: str) -> list[tuple[list[int], int]]:
    out = []
    for q in ("What is two plus two?", "Name a color.", "What is two plus two? Why?"):
        (r,) = llm.generate([SYSTEM + q], GREEDY, cache_domain=domain)
        out.append((r.outputs[0].token_ids, r.num_cached_tokens))
    return out


@pytest.mark.parametrize("mode", ["hash", "radix"])
def test_greedy_outputs_identical_with_cache_on_and_off(
    tiny_model: pathlib.Path, mode: str
) -> None:
    off = LLM(str(tiny_model), num_blocks=256, block_size=8, prefix_cache="off")
    on = LLM(str(tiny_model), num_blocks=256, block_size=8, prefix_cache=mode)
    ref = turns(off, "t:a")
    got = turns(on, "t:a")
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert all(c == 0 for _, c in ref)
    assert got[0][1] == 0 and got[1][1] > 0 and got[2][1] > got[1][1]
    # Another domain with the same prompts hits nothing.
    other = turns(on, "t:b")
    assert other[0][1] == 0
    stats = on.engine.stats()
    assert stats.prefix_cache_hits == sum(c for _, c in got + other)
    assert stats.prefix_cache_queries > stats.prefix_cache_hits > 0
    assert stats.prefix_cache_domains["t:a"].hits == 2
    on.engine.kv.check_integrity()
    assert on.engine.kv.pool.num_free == on.engine.kv.num_blocks


def test_cache_false_and_published_prefix_through_the_api(tiny_model: pathlib.Path) -> None:
    llm = LLM(str(tiny_model), num_blocks=256, block_size=8)
    system_ids = llm.tokenizer.encode(SYSTEM)
    shared_blocks = llm.engine.publish_prefix(system_ids)
    assert shared_blocks == len(system_ids) // 8
    (a,) = llm.generate([system_ids + [42, 43, 44]], GREEDY, cache_domain="t:a")
    (b,) = llm.generate([system_ids + [42, 43, 44]], GREEDY, cache_domain="t:b")
    (c,) = llm.generate([system_ids + [42, 43, 44]], GREEDY, cache_domain="t:c", use_cache=False)
    assert a.num_cached_tokens == 0
    assert b.num_cached_tokens == shared_blocks * 8  # the published blocks only
    assert c.num_cached_tokens == 0
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids


def test_scrub_zeroes_blocks_leaving_a_domain(tiny_model: pathlib.Path) -> None:
    llm = LLM(str(tiny_model), num_blocks=12, block_size=8, scrub_freed_blocks=True)
    engine = llm.engine
    original = engine.runner.scrub_blocks
    scrubbed: list[int] = []

    def recording(block_ids: list[int]) -> None:
        original(block_ids)
        for layer in engine.runner.kv_caches:
            assert torch.count_nonzero(layer[:, block_ids]) == 0
        scrubbed.extend(block_ids)

    engine.runner.scrub_blocks = recording  # type: ignore[method-assign]
    llm.generate([list(range(10, 60))], GREEDY, cache_domain="t:a")  # 58 tokens: 7 blocks
    cached_a = cached_block_ids(engine.kv)
    assert len(cached_a) == 7
    llm.generate([list(range(100, 180))], GREEDY, cache_domain="t:b")  # needs a's blocks
    evicted = {b for b in cached_a if block_domain(engine.kv, b) != "t:a"}
    assert evicted and evicted <= set(scrubbed)
    assert engine.stats().prefix_cache_domains["t:a"].evictions == len(evicted)
