"""engine.structured.compiler: a bounded cache of compiled grammars, failures cached too,
a compile time limit, and refusals that name what llguidance could not do."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from engine.config import StructuredConfig
from engine.errors import EngineOverloadedError
from engine.structured.compiler import GrammarCompiler, spec_digest
from engine.structured.spec import MAX_SPEC_BYTES, StructuredSpec, StructuredSpecError
from tests.utils.tiny_model import SMOLLM2_VOCAB, smollm2_tokenizer_dir


@pytest.fixture(scope="module")
def hf() -> Any:
    """SmolLM2's real tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))


def _compiler(hf: Any, **config: Any) -> GrammarCompiler:
    return GrammarCompiler(
        hf,
        vocab_size=SMOLLM2_VOCAB,
        eos_token_ids=[hf.eos_token_id],
        config=StructuredConfig(**config),
    )


def _regex(i: int) -> StructuredSpec:
    return StructuredSpec("regex", f"item-{i}[0-9]+")


def test_the_cache_is_bounded_and_evicts_the_least_recently_used(hf: Any) -> None:
    compiler = _compiler(hf, grammar_cache_size=3)
    for i in range(10):
        compiler.compile(_regex(i))
        compiler.check_integrity()
    assert len(compiler) == 3
    assert compiler.num_compiles == 10
    assert [compiler.lookup(_regex(i)) is not None for i in range(10)] == [False] * 7 + [True] * 3
    compiler.lookup(_regex(7))  # now the most recent: 8 is the oldest
    compiler.compile(_regex(0))
    assert compiler.lookup(_regex(8)) is None
    assert compiler.lookup(_regex(7)) is not None
    compiler.matcher(_regex(3))  # evicted: compiled again
    assert compiler.num_compiles == 12
    compiler.check_integrity()


def test_a_hit_compiles_nothing_and_each_matcher_is_fresh(hf: Any) -> None:
    compiler = _compiler(hf)
    spec = StructuredSpec("choice", json.dumps(["yes", "no"]))
    first = compiler.matcher(spec)
    assert first.consume_token(hf.encode("yes", add_special_tokens=False)[0])
    second = compiler.matcher(spec)
    assert compiler.num_compiles == 1
    assert not second.is_stopped()  # its own state, not the first one's
    assert first.is_stopped()


def test_failures_are_cached_and_name_the_unsupported_feature(hf: Any) -> None:
    compiler = _compiler(hf)
    spec = StructuredSpec("json_schema", json.dumps({"type": "object", "not": {}}))
    for _ in range(3):
        with pytest.raises(StructuredSpecError, match='"not"'):
            compiler.compile(spec)
    assert compiler.num_compiles == 1
    with pytest.raises(StructuredSpecError, match="look-around"):
        compiler.compile(StructuredSpec("regex", "(?=a)b"))
    with pytest.raises(StructuredSpecError, match="not valid JSON"):
        compiler.compile(StructuredSpec("json_schema", "{oops"))
    compiler.check_integrity()


def test_a_compile_over_the_time_limit_is_refused_with_the_limit(hf: Any) -> None:
    compiler = _compiler(hf, grammar_compile_timeout_s=1e-9)
    spec = StructuredSpec("regex", "[a-z]{1,40}@[a-z]{2,9}")
    with pytest.raises(StructuredSpecError, match="1e-09 s limit"):
        compiler.compile(spec)
    # Once the worker is done the spec is remembered as too slow: refused at once.
    compiler.submit(spec).result()
    entry = compiler.lookup(spec)
    assert entry is not None and entry.error is not None and "limit" in entry.error
    with pytest.raises(StructuredSpecError, match="limit"):
        asyncio.run(compiler.prepare(spec))


def test_prepare_runs_off_the_event_loop(hf: Any) -> None:
    compiler = _compiler(hf)
    ticks = 0

    async def main() -> None:
        nonlocal ticks

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(tick())
        await compiler.prepare(StructuredSpec("json_object"))  # first use: builds the tokenizer
        ticker.cancel()

    asyncio.run(main())
    assert ticks > 1  # the loop kept running while the worker compiled


def test_too_many_pending_compiles_are_refused(hf: Any) -> None:
    compiler = _compiler(hf, grammar_max_pending=2, grammar_compile_threads=1)
    # The first compile builds the tokenizer under this lock: holding it keeps the
    # compiles pending for as long as the test needs.
    with compiler._tokenizer_lock:
        first = compiler.submit(_regex(0))
        assert compiler.submit(_regex(0)) is first  # the same spec shares one compile
        second = compiler.submit(_regex(1))
        with pytest.raises(EngineOverloadedError, match="2 grammars"):
            compiler.submit(_regex(2))
        compiler.check_integrity()
    first.result()
    second.result()
    compiler.compile(_regex(2))  # room again


def test_spec_size_and_digest() -> None:
    with pytest.raises(StructuredSpecError, match=str(MAX_SPEC_BYTES)):
        StructuredSpec("regex", "a" * (MAX_SPEC_BYTES + 1))
    assert spec_digest(StructuredSpec("regex", "ab")) != spec_digest(StructuredSpec("lark", "ab"))
    assert spec_digest(StructuredSpec("regex", "ab")) == spec_digest(StructuredSpec("regex", "ab"))


def test_compiled_grammars_are_cached_per_cache_domain(hf: Any) -> None:
    """A hit must not tell one tenant that another compiled the same schema."""
    compiler = _compiler(hf)
    spec = _regex(1)
    compiler.compile(spec, "tenant-a")
    assert compiler.lookup(spec, "tenant-a") is not None
    assert compiler.lookup(spec, "tenant-b") is None
    compiler.matcher(spec, "tenant-b")
    assert compiler.num_compiles == 2
    # Length-prefixed: ("ab", regex "c") and ("a", regex "bc") are different keys.
    assert spec_digest(StructuredSpec("regex", "c"), "ab") != spec_digest(
        StructuredSpec("regex", "bc"), "a"
    )
