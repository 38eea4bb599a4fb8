"""Constraints that cannot finish (issue 46): refused when compiled where that can be
known (no finite derivation, no text at all, a schema too deep); in the engine, a
constraint that reaches a dead end, a parser limit or its mask budget ends its own
request ("length", its output kept) in one step, with no failure and no re-run of
the batch, and the rows beside it get the tokens they get alone."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from engine.config import StructuredConfig
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler
from engine.structured.grammar import MAX_SCHEMA_DEPTH
from engine.structured.lark_check import never_finishing_rules
from engine.structured.spec import StructuredSpec, StructuredSpecError
from tests.utils.tiny_model import SMOLLM2_VOCAB, smollm2_tokenizer_dir

PROMPT = [1, 17, 42, 99, 5]
DEAD_END = StructuredSpec("lark", r"start: /[a-z]{12}/ /[^\s\S]/")


@pytest.fixture(scope="module")
def hf() -> Any:
    """SmolLM2's real tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))


def _engine(folder: pathlib.Path, **options: Any) -> LLMEngine:
    eng = LLMEngine.from_options(str(folder), num_blocks=128, attention_backend="torch", **options)
    eng.keep_finished = True
    return eng


def _compiler(hf: Any) -> GrammarCompiler:
    return GrammarCompiler(
        hf, vocab_size=SMOLLM2_VOCAB, eos_token_ids=[hf.eos_token_id], config=StructuredConfig()
    )


def _run(engine: LLMEngine, params: list[SamplingParams]) -> list[CompletionOutput]:
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=p)) for p in params
    ]
    while engine.has_unfinished():
        engine.step()
    return [engine.finished[i].to_output().outputs[0] for i in ids]


@pytest.mark.parametrize(
    ("grammar", "stuck"),
    [
        ('start: "a" start', ["start"]),
        ('start: "a" start | "b" start', ["start"]),
        ('start: /[a-z ]*/ x\nx: "a" x', ["start", "x"]),
        ('start: x\nx: "(" y\ny: ")" x', ["start", "x", "y"]),
        ('start: "b" | "a" loop\nloop: "c" loop', ["loop"]),  # a trap behind one choice
        ('start: "x" | "a" start', []),
        ('?start: x+\nx: "a" | "(" x ")"', []),
        ('start: x "b"\nx: x x | "a"', []),
        ('start: x~0..3 [y]\nx: "a"\ny: "b" y?', []),
        ('start: "<tool_call>" %json{"type": "object"} "</tool_call>" // done', []),
        ("start: TEXT\nTEXT.2: /a+/\n%ignore WS\n%import common.WS", []),
        ('start: foo{"a"}', None),  # a template: not read, no opinion
    ],
)
def test_rules_without_a_finite_derivation_are_found(grammar: str, stuck: Any) -> None:
    assert never_finishing_rules(grammar) == stuck


def test_a_grammar_that_can_never_finish_is_refused_when_compiled(hf: Any) -> None:
    compiler = _compiler(hf)
    for grammar in ['start: "a" start', 'start: /[a-z ]*/ x\nx: "a" x']:
        with pytest.raises(StructuredSpecError, match="can never finish"):
            compiler.compile(StructuredSpec("lark", grammar))
    compiler.compile(StructuredSpec("lark", 'start: "a" start | "b"'))  # it can: taken


def test_a_constraint_no_text_matches_is_refused_when_compiled(hf: Any) -> None:
    compiler = _compiler(hf)
    for spec in [
        StructuredSpec("regex", r"[^\s\S]"),
        StructuredSpec("lark", 'start: A\nA: "a" & "b"'),
        StructuredSpec("json_schema", json.dumps({"$ref": "#"})),
    ]:
        with pytest.raises(StructuredSpecError, match="cannot be satisfied"):
            compiler.compile(spec)
    compiler.check_integrity()


def test_a_schema_nested_too_deeply_is_refused_by_its_depth(hf: Any) -> None:
    compiler = _compiler(hf)

    def nested(depth: int) -> str:
        return '{"type":"array","items":' * depth + '{"type":"integer"}' + "}" * depth

    compiler.compile(StructuredSpec("json_schema", nested(MAX_SCHEMA_DEPTH - 1)))
    for depth in (MAX_SCHEMA_DEPTH + 1, 1500):  # the second is past Python's own limit
        with pytest.raises(StructuredSpecError, match="nested too deeply"):
            compiler.compile(StructuredSpec("json_schema", nested(depth)))


def test_a_dead_end_ends_its_request_alone_in_one_step(engine: LLMEngine) -> None:
    free = [
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=0.9, seed=3, max_tokens=24),
    ]
    alone = _run(engine, free)
    runs = 0
    real = engine.runner.execute

    def counting(output: Any) -> Any:
        nonlocal runs
        runs += 1
        return real(output)

    real_run = engine.runner.run

    def counting_run(step: Any, previous: Any) -> Any:  # a step launched ahead
        nonlocal runs
        runs += 1
        return real_run(step, previous)

    engine.runner.execute = counting  # type: ignore[method-assign]
    engine.runner.run = counting_run  # type: ignore[method-assign]
    steps = 0
    ran_before = _steps_run(engine)
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=p))
        for p in [free[0], _dead_end(), free[1]]
    ]
    while engine.has_unfinished():
        engine.step()
        steps += 1
    if engine.overlap is not None:  # the last calls only take the step launched before
        steps = _steps_run(engine) - ran_before
    assert runs == steps  # no step was split and run again
    assert not engine.take_failures()
    outs = [engine.finished[i].to_output().outputs[0] for i in ids]
    assert [o.token_ids for o in (outs[0], outs[2])] == [o.token_ids for o in alone]
    dead = outs[1]
    assert dead.finish_reason == "length"
    assert len(dead.text) == 12 and dead.text.isalpha()  # what it got before the dead end
    metrics = engine.finished[ids[1]].metrics()
    assert metrics.first_token_time is not None
    assert len(engine.runner.matchers) == 0


def _steps_run(engine: LLMEngine) -> int:
    """Steps that ran a batch under overlap scheduling: launched ahead, or in turn."""
    stats = engine.stats(domains=False)
    return stats.num_overlapped_steps + stats.num_synchronous_steps


def _dead_end(**kw: Any) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=1, max_tokens=40, structured=DEAD_END, **kw)


def test_a_request_over_its_mask_budget_is_ended_and_its_grammar_refused(
    folder: pathlib.Path,
) -> None:
    engine = _engine(folder, grammar_mask_budget_s=1e-9)
    try:
        spec = StructuredSpec("regex", "[0-9]{2,3}-[a-z]{2}")
        free = SamplingParams(temperature=0.0, max_tokens=8)
        (alone,) = _run(engine, [free])
        params = SamplingParams(temperature=1.0, seed=0, max_tokens=20, structured=spec)
        ids = [
            engine.add_request(EngineRequest(prompt_token_ids=tuple(PROMPT), params=p))
            for p in [params, free]
        ]
        while engine.has_unfinished():
            engine.step()
        assert not engine.take_failures()
        over, bystander = (engine.finished[i].to_output().outputs[0] for i in ids)
        assert over.finish_reason == "length" and over.token_ids == []
        assert bystander.token_ids == alone.token_ids
        # The same constraint again, from the same cache domain: a 400 when compiled.
        with pytest.raises(StructuredSpecError, match="mask time"):
            engine.grammars.compile(spec, "default")
        engine.grammars.compile(spec, "another")  # other domains are not told
    finally:
        engine.grammars.shutdown()
