"""Constrained decoding in the engine: every sampled token is one the grammar allows,
free rows are untouched by structured neighbours, a complete grammar ends its sequence,
and a retried step rolls the matchers back with the random state."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest
import torch

from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec
from engine.structured.token_mask import TokenMask, allowed_tokens, apply_token_mask

PROMPT = [1, 17, 42, 99, 5]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}
SPECS = [
    StructuredSpec("json_schema", json.dumps(SCHEMA)),
    StructuredSpec("regex", "[0-9]{2,3}-[a-z]{2}"),
    StructuredSpec("choice", json.dumps(["yes", "no", "maybe"])),
]


def _run(
    engine: LLMEngine, params: list[SamplingParams], *, whole: bool = False
) -> list[CompletionOutput]:
    """Runs `params` to the end; `whole`: each step waits until every running sequence's
    next mask is filled, so that no row sits a step out."""
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=p)) for p in params
    ]
    table = engine.runner.matchers
    while engine.has_unfinished():
        while whole and not all(table.ready(s) for s in engine.scheduler.running):
            table.wait_ahead(1.0)
        engine.step()
    return [engine.finished[i].to_output().outputs[0] for i in ids]


def _sampled(spec: StructuredSpec, seed: int, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=60, structured=spec, **kw)


def test_every_sampled_token_is_allowed_and_a_complete_grammar_stops(engine: LLMEngine) -> None:
    params = [_sampled(spec, seed) for spec in SPECS for seed in range(3)]
    params.append(SamplingParams(temperature=0.0, max_tokens=60, structured=SPECS[0]))
    outputs = _run(engine, params)
    eos = engine.tokenizer.eos_token_ids
    for p, out in zip(params, outputs, strict=True):
        assert p.structured is not None
        # Replaying the tokens through a fresh matcher: each one was allowed.
        matcher = engine.grammars.matcher(p.structured)
        assert all(matcher.consume_token(t) for t in out.token_ids), out.text
        assert matcher.is_stopped()
        assert out.finish_reason == "stop"
        assert not eos & set(out.token_ids)  # ended by the grammar, not by an EOS
    texts = [o.text for o in outputs]
    for text in texts[:3] + texts[-1:]:
        value = json.loads(text)
        assert set(value) == {"name", "age", "kind"} and len(value["name"]) <= 6
    assert len(set(texts[:3])) > 1  # seeds differ
    assert len(engine.runner.matchers) == 0  # released at finish


def test_free_rows_get_the_same_tokens_beside_structured_rows(engine: LLMEngine) -> None:
    free = [
        SamplingParams(temperature=0.0, max_tokens=12),
        SamplingParams(temperature=0.9, seed=3, max_tokens=12, top_p=0.9),
        SamplingParams(temperature=1.0, seed=4, max_tokens=12, logprobs=2),
    ]
    alone = _run(engine, free)
    mixed = _run(engine, [_sampled(SPECS[0], 0), *free, _sampled(SPECS[1], 1)])
    for a, m in zip(alone, mixed[1:4], strict=True):
        assert a.token_ids == m.token_ids
        # The same tokens and candidates; the values only to float rounding, since a
        # CPU GEMM's blocking (and so its sums' order) depends on the batch's row count.
        assert (a.logprobs is None) == (m.logprobs is None)
        for pa, pm in zip(a.logprobs or (), m.logprobs or (), strict=True):
            assert [t.token_id for t in pa.top] == [t.token_id for t in pm.top]
            assert pa.chosen.token_id == pm.chosen.token_id
            assert pa.chosen.logprob == pytest.approx(pm.chosen.logprob, abs=1e-4)
            for ta, tm in zip(pa.top, pm.top, strict=True):
                assert ta.logprob == pytest.approx(tm.logprob, abs=1e-4)


def test_a_retried_step_rolls_matchers_back(engine: LLMEngine) -> None:
    # Long enough outputs that whole three-row decode steps exist to fail.
    params = [_sampled(SPECS[0], 0), _sampled(SPECS[1], 1), _sampled(SPECS[0], 2)]
    expected = _run(engine, params)
    faulty = engine  # the same engine again, now with a fault (fresh request ids)
    real = faulty.runner.execute
    calls = 0
    raised = 0

    def execute_then_fail(output: Any) -> Any:
        # Runs the whole step (every matcher consumes its token, every generator
        # draws), then fails it: the split-and-retry must undo both.
        # The first three whole decode steps fail (every step is whole: `_run` waits for
        # the masks filled ahead).
        nonlocal calls, raised
        calls += 1
        result = real(output)
        if calls > 1 and raised < 3 and len(output.scheduled) == len(params):
            raised += 1
            raise RuntimeError("transient device fault")
        return result

    faulty.runner.execute = execute_then_fail  # type: ignore[method-assign]
    got = _run(faulty, params, whole=True)
    assert raised >= 2  # whole steps failed after every row had consumed its token
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert not faulty.take_failures()


def test_rewind_rolls_a_matcher_back_to_the_sequence(engine: LLMEngine) -> None:
    engine.add_request(
        EngineRequest(prompt_token_ids=tuple(PROMPT), params=_sampled(SPECS[1], 0), request_id="r")
    )
    engine.step()  # prefill: one token sampled and consumed
    (seq,) = engine.requests["r"].seqs
    table = engine.runner.matchers
    assert table.consumed(seq.seq_id) == seq.num_output_tokens == 1
    seq.output_token_ids.pop()  # as if the step's token had never been appended
    table.rewind(seq)
    assert table.consumed(seq.seq_id) == 0
    engine.abort("r")
    assert table.consumed(seq.seq_id) is None


def test_the_plain_greedy_path_stays_for_batches_without_a_grammar(engine: LLMEngine) -> None:
    calls = 0
    real = engine.runner.sampler.sample

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kw)

    engine.runner.sampler.sample = counting  # type: ignore[method-assign]
    _run(engine, [SamplingParams(temperature=0.0, max_tokens=5)])
    assert calls == 0
    _run(engine, [SamplingParams(temperature=0.0, max_tokens=5, structured=SPECS[2])])
    assert calls > 0


def test_the_mask_refuses_exactly_the_unset_bits() -> None:
    vocab = 70
    allowed = {0, 31, 32, 33, 63, 64, 69}
    bitmask = torch.zeros((1, 3), dtype=torch.int32)
    for token in allowed:
        word, bit = divmod(token, 32)
        value = int(bitmask[0, word]) | (1 << bit)
        bitmask[0, word] = value - (1 << 32) if value >= 1 << 31 else value
    assert set(allowed_tokens(bitmask, vocab)[0].nonzero().flatten().tolist()) == allowed
    logits = torch.randn(3, vocab)
    before = logits.clone()
    apply_token_mask(logits, TokenMask((1,), bitmask))
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    finite = set(torch.isfinite(logits[1]).nonzero().flatten().tolist())
    assert finite == allowed
    # Tokens past the mask's words (a model padded beyond the tokenizer) are refused.
    wide = torch.randn(1, 100)
    apply_token_mask(wide, TokenMask((0,), bitmask))
    assert not torch.isfinite(wide[0, 96:]).any()


def test_llguidance_bitmask_layout_matches_ours(engine: LLMEngine) -> None:
    """Our unpacking agrees with llguidance's own check of a token, on a real mask."""
    import llguidance.torch

    matcher = engine.grammars.matcher(SPECS[1])
    bitmask = llguidance.torch.allocate_token_bitmask(1, engine.vocab_size)
    llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
    allowed = allowed_tokens(bitmask, engine.vocab_size)[0].nonzero().flatten().tolist()
    assert 0 < len(allowed) < 100
    for token in allowed[:20]:
        probe: llguidance.LLMatcher = matcher.deep_copy()
        assert probe.consume_token(token)
    refused = next(t for t in range(engine.vocab_size) if t not in set(allowed))
    assert not matcher.deep_copy().consume_token(refused)
