"""Speculative decoding in the engine, on a tiny random-weight model: greedy output is
the output without speculation, and the KV pool and prefix cache stay exact."""

from __future__ import annotations

import pathlib
import random
from typing import Any

import pytest

from engine.kv_cache.manager import KVCacheManager
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec
from tests.utils.spec_proposers import SometimesWrong
from tests.utils.tiny_model import make_tiny_model_dir

BLOCK = 8
# Drafts on every decode step whatever the measured costs (the gate's own tests cover those).
SPEC: dict[str, Any] = {"speculative_method": "ngram", "speculative_max_batch": 64}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_spec"))


def _prompts() -> list[list[int]]:
    """Prompts with runs the model's output can copy, and random ones."""
    rng = random.Random(7)
    loop = [rng.randrange(100, 5000) for _ in range(6)]
    return [
        loop * 6,
        [rng.randrange(100, 5000) for _ in range(30)],
        [11, 12, 13] * 9 + [rng.randrange(100, 5000) for _ in range(5)],
        [rng.randrange(100, 5000) for _ in range(17)] + loop * 3,
        [rng.randrange(100, 5000) for _ in range(45)],
    ]


def _run(
    model: pathlib.Path,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    check: bool = True,
    wrong: bool = True,
    **options: Any,
) -> tuple[dict[str, list[list[int]]], LLMEngine]:
    engine = LLMEngine.from_options(str(model), block_size=BLOCK, **options)
    if engine.speculator is not None and wrong:
        engine.speculator.proposer = SometimesWrong()
    engine.keep_finished = True
    for i, prompt in enumerate(prompts):
        engine.add_request(
            EngineRequest(prompt_token_ids=tuple(prompt), params=params, request_id=f"r{i}")
        )
    while engine.has_unfinished():
        engine.step()
        if check:
            engine.kv.check_integrity()
            _no_block_past_known_tokens(engine)
    outputs = {
        rid: [seq.output_token_ids for seq in state.seqs] for rid, state in engine.finished.items()
    }
    return outputs, engine


def _no_block_past_known_tokens(engine: LLMEngine) -> None:
    """Between steps a running sequence holds blocks for its known tokens only."""
    for seq in engine.scheduler.running:
        assert len(seq.block_ids) <= engine.kv.blocks_needed(seq.num_tokens)


GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def test_greedy_output_is_identical_in_a_mixed_batch(tiny_model: pathlib.Path) -> None:
    prompts = _prompts()
    plain, _ = _run(tiny_model, prompts, GREEDY, num_blocks=128)
    spec, engine = _run(tiny_model, prompts, GREEDY, num_blocks=128, **SPEC)
    assert spec == plain
    stats = engine.stats().spec_decode
    assert stats is not None
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    # Some drafts were wrong, so the rollback path ran too.
    assert stats.num_accepted_tokens < stats.num_draft_tokens
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens
    # Fewer steps than tokens: the accepted drafts saved forward passes.
    assert engine.stats().num_generated_tokens == 40 * len(prompts)


def test_greedy_output_is_identical_across_preemptions(tiny_model: pathlib.Path) -> None:
    prompts = _prompts()
    plain, _ = _run(tiny_model, prompts, GREEDY, num_blocks=128)
    # A pool too small for all five at once: sequences are preempted and recomputed.
    spec, engine = _run(tiny_model, prompts, GREEDY, num_blocks=24, **SPEC)
    assert engine.scheduler.num_preemptions > 0
    assert spec == plain


def test_prefix_cache_hits_give_the_same_tokens(tiny_model: pathlib.Path) -> None:
    prompt = _prompts()[0]
    plain, _ = _run(tiny_model, [prompt], GREEDY, num_blocks=128, prefix_cache="off")
    engine = LLMEngine.from_options(str(tiny_model), block_size=BLOCK, num_blocks=128, **SPEC)
    engine.keep_finished = True
    for rid in ("first", "again"):
        engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(prompt + plain["r0"][0][:20]), params=GREEDY, request_id=rid
            )
        )
        while engine.has_unfinished():
            engine.step()
    assert engine.stats().prefix_cache_hits > 0
    first = engine.finished["first"].seqs[0].output_token_ids
    again = engine.finished["again"].seqs[0].output_token_ids
    assert first == again
    reference, _ = _run(
        tiny_model, [prompt + plain["r0"][0][:20]], GREEDY, num_blocks=128, prefix_cache="off"
    )
    assert first == reference["r0"][0]


def test_a_rejected_token_never_reaches_the_prefix_cache(
    tiny_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inserted: list[tuple[tuple[int, ...], ...]] = []
    original = KVCacheManager.cache_full_blocks

    def recording(self: KVCacheManager, seq: Any) -> None:
        before = len(self._state(seq).chunks) if self.index is not None else 0
        original(self, seq)
        if self.index is not None and seq.use_cache:
            st = self._state(seq)
            # Every block registered so far holds the sequence's real tokens: compare
            # the chunks keyed for it with its tokens now (accepted ones only).
            for i, chunk in enumerate(st.chunks[: st.registered]):
                assert tuple(chunk) == tuple(seq.token_ids(i * BLOCK, (i + 1) * BLOCK)), (
                    f"block {i} of {seq.seq_id} was keyed with tokens it does not hold"
                )
            inserted.append(tuple(tuple(c) for c in st.chunks[before:]))

    monkeypatch.setattr(KVCacheManager, "cache_full_blocks", recording)
    outputs, engine = _run(tiny_model, _prompts(), GREEDY, num_blocks=128, **SPEC)
    stats = engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens < stats.num_draft_tokens
    assert any(inserted)
    # And every cached block's chunk is a block of some finished sequence's final tokens.
    finals = [
        tuple(prompt + out[0])
        for prompt, out in zip(_prompts(), (outputs[f"r{i}"] for i in range(5)), strict=True)
    ]
    blocks = {f[i : i + BLOCK] for f in finals for i in range(0, len(f) - BLOCK + 1, BLOCK)}
    for chunks in inserted:
        for chunk in chunks:
            assert chunk in blocks


def test_stops_inside_an_accepted_draft_end_the_sequence_there(tiny_model: pathlib.Path) -> None:
    prompt = _prompts()[0]
    plain, _ = _run(tiny_model, [prompt], GREEDY, num_blocks=128)
    tokens = plain["r0"][0]
    stop_at = tokens[12]
    params = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=(stop_at,))
    expect, _ = _run(tiny_model, [prompt], params, num_blocks=128)
    got, engine = _run(tiny_model, [prompt], params, num_blocks=128, **SPEC)
    assert got == expect
    assert got["r0"][0][-1] == stop_at
    for max_tokens in (1, 2, 7):
        short = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        got, _ = _run(tiny_model, [prompt], short, num_blocks=128, **SPEC)
        assert got["r0"][0] == tokens[:max_tokens]


def test_n_samples_and_seeded_sampling_with_speculation(tiny_model: pathlib.Path) -> None:
    prompts = _prompts()[:3]
    greedy_n = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=2)
    plain, _ = _run(tiny_model, prompts, greedy_n, num_blocks=128)
    spec, _ = _run(tiny_model, prompts, greedy_n, num_blocks=128, **SPEC)
    assert spec == plain
    seeded = SamplingParams(temperature=1.5, max_tokens=24, ignore_eos=True, seed=5, n=2)
    a, engine = _run(tiny_model, prompts, seeded, num_blocks=128, **SPEC)
    b, _ = _run(tiny_model, prompts, seeded, num_blocks=128, **SPEC)
    assert a == b  # reproducible with speculation on
    # The two samples of a request have their own draws.
    assert any(samples[0] != samples[1] for samples in a.values())
    stats = engine.stats().spec_decode
    assert stats is not None and stats.num_drafts > 0


def test_requests_speculation_cannot_serve_decode_one_token_a_step(
    tiny_model: pathlib.Path,
) -> None:
    prompt = _prompts()[0]
    cases = [
        SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, logit_bias=((5, 2.0),), ignore_eos=True),
        SamplingParams(
            temperature=0.0,
            max_tokens=16,
            structured=StructuredSpec(kind="regex", value="[a-z ]{1,40}"),
        ),
    ]
    for params in cases:
        plain, _ = _run(tiny_model, [prompt], params, num_blocks=128, check=False)
        spec, engine = _run(tiny_model, [prompt], params, num_blocks=128, check=False, **SPEC)
        assert spec == plain
        stats = engine.stats().spec_decode
        assert stats is not None and stats.num_drafts == 0, params


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("num_speculative_tokens", 0, "num_speculative_tokens"),
        ("num_speculative_tokens", -3, "num_speculative_tokens"),
        ("num_speculative_tokens", 10**6, "num_speculative_tokens"),
        ("num_speculative_tokens", True, "num_speculative_tokens"),
        ("speculative_method", "eagle9", "speculative_method"),
        ("speculative_max_batch", 0, "speculative_max_batch"),
        ("speculative_model", "/tmp/draft", "speculative_model"),
        ("speculative_method", "draft", "speculative_model"),
    ],
)
def test_bad_settings_are_refused_at_start(
    tiny_model: pathlib.Path, option: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_options(str(tiny_model), num_blocks=16, **{option: value})


def test_speculation_off_reports_no_counters(tiny_model: pathlib.Path) -> None:
    engine = LLMEngine.from_options(str(tiny_model), num_blocks=16, block_size=BLOCK)
    assert engine.speculator is None
    assert engine.stats().spec_decode is None


def test_a_stop_string_inside_an_accepted_draft_ends_the_text_there(
    tiny_model: pathlib.Path,
) -> None:
    prompt = _prompts()[3]
    plain, engine = _run(tiny_model, [prompt], GREEDY, num_blocks=128)
    text = engine.tokenizer.decode(plain["r0"][0][:20])
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=(stop,), ignore_eos=True)

    def finished(**options: Any) -> tuple[str, list[int], str | None]:
        engine = LLMEngine.from_options(
            str(tiny_model), block_size=BLOCK, num_blocks=128, **options
        )
        engine.keep_finished = True
        engine.add_request(
            EngineRequest(prompt_token_ids=tuple(prompt), params=params, request_id="s")
        )
        while engine.has_unfinished():
            engine.step()
        state = engine.finished["s"]
        seq = state.seqs[0]
        return state.samples[0].detok.text, seq.output_token_ids, seq.finish_reason

    expect = finished()
    got = finished(**SPEC)
    assert got == expect
    assert expect[2] == "stop" and stop not in expect[0]


def test_a_retried_verify_step_draws_the_same_tokens(tiny_model: pathlib.Path) -> None:
    """A step that fails after sampling is retried with the generators rewound: a sampled
    verify row that rejected a draft drew one uniform more than it emitted, and the
    retry must replay that too."""
    prompts = _prompts()[:3]
    seeded = SamplingParams(temperature=1.5, max_tokens=24, ignore_eos=True, seed=9)
    expected, _ = _run(tiny_model, prompts, seeded, num_blocks=128, **SPEC)
    engine = LLMEngine.from_options(str(tiny_model), block_size=BLOCK, num_blocks=128, **SPEC)
    assert engine.speculator is not None
    engine.speculator.proposer = SometimesWrong()
    engine.keep_finished = True
    real = engine.runner.execute
    raised = 0

    def execute_then_fail(output: Any) -> Any:
        nonlocal raised
        result = real(output)
        if raised < 4 and any(item.spec for item in output.scheduled) and len(output.scheduled) > 1:
            raised += 1
            raise RuntimeError("transient device fault")
        return result

    engine.runner.execute = execute_then_fail  # type: ignore[method-assign]
    for i, prompt in enumerate(prompts):
        engine.add_request(
            EngineRequest(prompt_token_ids=tuple(prompt), params=seeded, request_id=f"r{i}")
        )
    while engine.has_unfinished():
        engine.step()
    got = {rid: [s.output_token_ids for s in st.seqs] for rid, st in engine.finished.items()}
    assert raised >= 2
    assert got == expected
    assert not engine.take_failures()
    assert any(s.spec_extra_draws for st in engine.finished.values() for s in st.seqs)
