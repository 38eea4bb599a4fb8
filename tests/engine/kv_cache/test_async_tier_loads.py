"""Tier loads off the step's path (issue 41, item 3): a sequence whose cached blocks are
still being loaded from the host tier waits, admitted, while the rest of the batch
runs; it runs once the load is joined, with the logits of a device hit.

The copier's worker is gated by the test (`gate`), so what is asserted is the
schedule and the state at each step, never a duration. The setup is
tests/engine/prefix_cache/test_host_tier.py's: a pool of 12 blocks of 8 tokens, a
58-token prompt of tenant a (7 full blocks), all but one evicted to the host tier
by an 80-token prompt of tenant b.
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator

import pytest

from engine import LLM, SamplingParams
from engine.kv_cache.host_tier import TierOp
from engine.kv_cache.tier_copier import TierCopier
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.request import EngineRequest
from engine.sequence import Sequence
from engine_hop.tier_metrics import tier_totals
from tests.utils.kv_inspect import block_domain
from tests.utils.tiny_model import make_tiny_model_dir

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)
PROMPT_A = list(range(10, 68))  # 58 tokens: 7 full blocks, the last token computed
FLOOD_B = list(range(100, 180))  # 80 tokens: evicts a's blocks to the host tier
# Tenant a again, another continuation of the same 56 cached tokens.
PROMPT_A2 = PROMPT_A[:56] + [300, 301, 302, 303, 304]
SHORT_C = list(range(200, 210))  # another tenant's small request: it keeps running


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_async_loads"))


def evicted_to_l2(model: pathlib.Path) -> LLM:
    """An engine whose tenant a has 6 of PROMPT_A's 7 blocks in the host tier only (its
    fair floor keeps the first one on the device)."""
    llm = LLM(str(model), num_blocks=12, block_size=8, kv_host_bytes=1 << 22)
    llm.generate([PROMPT_A], GREEDY, cache_domain="t:a")
    llm.generate([FLOOD_B], GREEDY, cache_domain="t:b")
    assert llm.engine.kv.tier is not None
    assert llm.engine.kv.tier.domain_blocks().get("t:a", 0) == 6
    return llm


def device_hit(model: pathlib.Path, *prompts: list[int]) -> list[RequestOutput]:
    """`prompts`, run together, served with their first 56 tokens from a device pool
    that kept them (the same rows in the same steps: the same floats, to the bit)."""
    roomy = LLM(str(model), num_blocks=64, block_size=8)
    roomy.generate([PROMPT_A], GREEDY, cache_domain="t:a")
    outs = roomy.generate(list(prompts), GREEDY, cache_domain="t:a")
    assert all(out.num_cached_tokens == 56 for out in outs)
    return outs


def recomputed(model: pathlib.Path, prompt: list[int]) -> RequestOutput:
    """`prompt` computed whole, with no cache at all."""
    off = LLM(str(model), num_blocks=64, block_size=8, prefix_cache="off")
    (out,) = off.generate([prompt], GREEDY, cache_domain="t:a")
    return out


def copier_of(engine: LLMEngine) -> TierCopier:
    assert engine.tier_io is not None
    return engine.tier_io


@pytest.fixture
def gates() -> Iterator[list[threading.Event]]:
    """The test's gates, opened at its end whatever happened: a worker left blocked
    would hold the interpreter's exit (it joins the worker threads)."""
    made: list[threading.Event] = []
    yield made
    for opened in made:
        opened.set()


def gate(copier: TierCopier, gates: list[threading.Event]) -> threading.Event:
    """Holds every load on the worker until the returned event is set."""
    opened = threading.Event()
    gates.append(opened)
    inner = copier.copy

    def gated(ops: list[TierOp]) -> dict[str, float]:
        opened.wait()
        return inner(ops)

    copier.copy = gated
    return opened


def evicted_and_gated(
    model: pathlib.Path, gates: list[threading.Event]
) -> tuple[LLM, TierCopier, threading.Event]:
    """`evicted_to_l2(model)`, its engine's tier copier, and the gate that holds back
    that copier's loads until it is set."""
    llm = evicted_to_l2(model)
    copier = copier_of(llm.engine)
    return llm, copier, gate(copier, gates)


def add(engine: LLMEngine, prompt: list[int], domain: str) -> str:
    return engine.add_request(
        EngineRequest(prompt_token_ids=tuple(prompt), params=GREEDY, cache_domain=domain)
    )


def seq_of(engine: LLMEngine, request_id: str) -> Sequence:
    return next(s for s in engine._live_seqs() if s.request_id == request_id)


def finish(engine: LLMEngine, ids: list[str]) -> dict[str, RequestOutput]:
    for _ in range(100):  # bounded: a sequence that never got ready fails, not hangs
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished()
    return {i: engine.finished.pop(i).to_output() for i in ids}


def test_a_loading_sequence_waits_while_the_batch_runs(
    tiny_model: pathlib.Path, gates: list[threading.Event]
) -> None:
    llm, copier, opened = evicted_and_gated(tiny_model, gates)
    engine = llm.engine
    loads_before = engine.stats().kv_tiers[0].loads
    a = add(engine, PROMPT_A, "t:a")
    assert engine.step() == []  # nothing ran: the only sequence waits for its blocks
    seq_a = seq_of(engine, a)
    # Admitted with its 7 cached blocks reserved, 6 loads queued and held back.
    assert seq_a in engine.scheduler.running
    assert seq_a.num_computed_tokens == 56 and len(seq_a.block_ids) == 8
    assert engine.stats().kv_tiers[0].loads == loads_before + 6
    assert not engine.kv.ready(seq_a) and copier.busy
    c = add(engine, SHORT_C, "t:c")
    seq_c = seq_of(engine, c)
    for n in (1, 2, 3, 4):
        engine.step()
        # The other tenant's request ran its prompt and decodes to its end meanwhile.
        assert seq_c.num_output_tokens == n
    assert c in engine.finished
    assert seq_a.num_output_tokens == 0 and seq_a.num_computed_tokens == 56
    opened.set()
    copier.drain()  # the worker is done; the next step joins it
    outs = finish(engine, [a, c])
    assert not copier.busy and engine.kv.ready(seq_a)
    (hit,), full = device_hit(tiny_model, PROMPT_A), recomputed(tiny_model, PROMPT_A)
    got = outs[a]
    assert got.num_cached_tokens == 56
    assert got.outputs[0].token_ids == full.outputs[0].token_ids
    # Bit-identical to a device hit over the same bytes: the loaded blocks were read
    # only once their copy was in.
    assert got.outputs[0].logprobs == hit.outputs[0].logprobs
    engine.kv.check_integrity()


def test_a_second_sequence_over_a_loading_block_waits_too(
    tiny_model: pathlib.Path, gates: list[threading.Event]
) -> None:
    llm, copier, opened = evicted_and_gated(tiny_model, gates)
    engine = llm.engine
    a = add(engine, PROMPT_A, "t:a")
    assert engine.step() == []
    seq_a = seq_of(engine, a)
    assert not engine.kv.ready(seq_a)
    loads = engine.stats().kv_tiers[0].loads
    # Same domain, same 56 tokens, another tail: the blocks are device hits now (their
    # load already queued), so nothing more is loaded, and it waits for the same load.
    a2 = add(engine, PROMPT_A2, "t:a")
    assert engine.step() == []
    seq_a2 = seq_of(engine, a2)
    assert seq_a2 in engine.scheduler.running and seq_a2.num_computed_tokens == 56
    assert seq_a.block_ids[:7] == seq_a2.block_ids[:7]
    assert engine.stats().kv_tiers[0].loads == loads
    assert not engine.kv.ready(seq_a2)
    c = add(engine, SHORT_C, "t:c")
    for _ in range(4):
        engine.step()
    assert c in engine.finished  # the other tenant ran to its end meanwhile
    assert seq_a.num_output_tokens == seq_a2.num_output_tokens == 0
    opened.set()
    copier.drain()
    outs = finish(engine, [a, a2, c])
    hit_a, hit_a2 = device_hit(tiny_model, PROMPT_A, PROMPT_A2)
    assert outs[a2].num_cached_tokens == 56
    assert outs[a].outputs[0].logprobs == hit_a.outputs[0].logprobs
    assert outs[a2].outputs[0].logprobs == hit_a2.outputs[0].logprobs
    engine.kv.check_integrity()


def test_a_failed_load_is_recomputed(tiny_model: pathlib.Path) -> None:
    llm = evicted_to_l2(tiny_model)
    engine = llm.engine
    copier = copier_of(engine)
    tier = engine.kv.tier
    assert tier is not None
    working = copier.copy

    def broken(ops: list[TierOp]) -> dict[str, float]:
        raise OSError("host tier copy failed")

    copier.copy = broken
    a = add(engine, PROMPT_A, "t:a")
    engine.step()
    c = add(engine, SHORT_C, "t:c")
    seq_a = seq_of(engine, a)
    assert engine.kv.loading is not None
    loaded = [b for b in seq_a.block_ids if b in engine.kv.loading]
    assert loaded and not engine.kv.ready(seq_a)
    held = tier.domain_blocks()["t:a"]
    loads = tier.stats().loads
    copier.drain()
    copier.copy = working
    engine.step()  # joins the failure: a is sent back, and computed from scratch
    assert seq_a.num_preemptions == 1 and engine.kv.ready(seq_a)
    assert all(block_domain(engine.kv, b) != "t:a" for b in loaded)  # dropped from the device
    # The tier forgot the blocks whose load failed: no second try of them.
    assert tier.domain_blocks().get("t:a", 0) == held - len(loaded)
    outs = finish(engine, [a, c])
    assert tier.stats().loads == loads  # a computed them
    full = recomputed(tiny_model, PROMPT_A)
    got, ref = outs[a].outputs[0], full.outputs[0]
    assert got.token_ids == ref.token_ids
    assert got.logprobs is not None and ref.logprobs is not None
    for x, y in zip(got.logprobs, ref.logprobs, strict=True):
        assert [t.token_id for t in x.top] == [t.token_id for t in y.top]
        assert [t.logprob for t in x.top] == pytest.approx([t.logprob for t in y.top], abs=1e-4)
    engine.kv.check_integrity()
    # What was recomputed is cached again: the next turn is a device hit.
    (again,) = llm.generate([PROMPT_A], GREEDY, cache_domain="t:a")
    assert again.num_cached_tokens == 56
    assert again.outputs[0].token_ids == ref.token_ids


def test_transfer_times_accumulate(tiny_model: pathlib.Path) -> None:
    llm = LLM(str(tiny_model), num_blocks=12, block_size=8, kv_host_bytes=1 << 22)
    engine = llm.engine
    llm.generate([PROMPT_A], GREEDY, cache_domain="t:a")
    (host,) = engine.stats().kv_tiers
    assert host.store_time_s == 0.0 and host.load_time_s == 0.0
    llm.generate([FLOOD_B], GREEDY, cache_domain="t:b")
    (flooded,) = engine.stats().kv_tiers
    assert flooded.write_backs > 0 and flooded.store_time_s > 0.0
    assert flooded.load_time_s == 0.0
    llm.generate([PROMPT_A], GREEDY, cache_domain="t:a")
    (loaded,) = engine.stats().kv_tiers
    assert loaded.loads > 0 and loaded.load_time_s > 0.0
    assert loaded.store_time_s >= flooded.store_time_s
    # Exported under vLLM's offloading connector's names, in seconds.
    totals = tier_totals(engine.stats())
    assert totals["kv_offload_load_time"] == loaded.load_time_s
    assert totals["kv_offload_store_time"] == loaded.store_time_s
