"""A structured request through the asyncio front: the engine loop never compiles on its
own thread (a request whose grammar is not ready waits for a worker), and a constraint
that cannot compile fails that request alone."""

from __future__ import annotations

import asyncio
import functools
import json
import pathlib
import threading

import pytest

from engine.errors import RequestAbortedError
from engine.fronts.async_engine import AsyncEngine
from engine.fronts.process_engine import ProcessEngine
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec, StructuredSpecError


def _request(rid: str, spec: StructuredSpec | None, max_tokens: int = 24) -> EngineRequest:
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=max_tokens, structured=spec)
    return EngineRequest(prompt_token_ids=(1, 2, 3), params=params, request_id=rid)


async def _text(engine: AsyncEngine, request: EngineRequest) -> tuple[str, str | None]:
    text, reason = "", None
    async for event in engine.submit(request):
        for delta in event.deltas:
            text += delta.text
            reason = delta.finish_reason or reason
    return text, reason


def test_unprepared_grammars_compile_off_the_loop_and_bad_ones_fail_alone(
    folder: pathlib.Path,
) -> None:
    engine = AsyncEngine.from_options(str(folder), num_blocks=64, attention_backend="torch")
    compiled_on: list[str] = []
    real = engine.engine.grammars._build

    def recording(*args: object) -> object:
        compiled_on.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    engine.engine.grammars._build = recording  # type: ignore[method-assign]
    regex = StructuredSpec("regex", "[a-c]{3}-[0-9]{2}")
    bad = StructuredSpec("json_schema", json.dumps({"type": "object", "not": {}}))

    async def main() -> tuple[tuple[str, str | None], tuple[str, str | None], BaseException]:
        await engine.start()
        try:
            good = asyncio.ensure_future(_text(engine, _request("good", regex)))
            free = asyncio.ensure_future(_text(engine, _request("free", None, 8)))
            with pytest.raises(StructuredSpecError) as caught:
                await _text(engine, _request("bad", bad))
            return await good, await free, caught.value
        finally:
            await engine.shutdown()

    (text, reason), (free_text, free_reason), error = asyncio.run(main())
    assert len(text) == 6 and text[3] == "-" and reason == "stop"
    assert free_reason == "length" and free_text
    assert '"not"' in str(error)
    assert compiled_on and all(name.startswith("grammar") for name in compiled_on)
    engine.engine.grammars.check_integrity()


@pytest.mark.slow
def test_a_child_process_engine_compiles_its_own_grammars(folder: pathlib.Path) -> None:
    """The spec crosses the pipe inside the request; the child compiles off its loop."""
    factory = functools.partial(
        LLMEngine.from_options, str(folder), num_blocks=64, attention_backend="torch"
    )
    engine = ProcessEngine(factory)
    choice = StructuredSpec("choice", json.dumps(["alpha", "beta", "gamma delta"]))
    bad = StructuredSpec("regex", "(?=x)y")

    async def main() -> tuple[tuple[str, str | None], BaseException, BaseException]:
        await engine.start()
        try:
            await engine.prepare_structured(choice, "default")  # the front's own compiler
            with pytest.raises(StructuredSpecError) as refused:
                await engine.prepare_structured(bad, "default")
            with pytest.raises(StructuredSpecError) as failed:  # unprepared: the child refuses
                await _text(engine, _request("bad", bad))
            return await _text(engine, _request("good", choice)), refused.value, failed.value
        finally:
            await engine.shutdown()

    (text, reason), refused, failed = asyncio.run(main())
    assert text in {"alpha", "beta", "gamma delta"} and reason == "stop"
    assert "look-around" in str(refused) and "look-around" in str(failed)


def test_a_request_aborted_while_its_grammar_compiles_never_runs(folder: pathlib.Path) -> None:
    engine = AsyncEngine.from_options(str(folder), num_blocks=64, attention_backend="torch")
    grammars = engine.engine.grammars
    spec = StructuredSpec("regex", "[a-z]{5}")

    async def main() -> BaseException | None:
        await engine.start()
        try:
            # The first compile builds the tokenizer under this lock: while it is held,
            # the request waits for its grammar and the loop keeps serving others.
            with grammars._tokenizer_lock:
                stream = engine.submit(_request("late", spec))
                # A loop that compiled on its own thread would block here: fail, not hang.
                free = await asyncio.wait_for(_text(engine, _request("free", None, 4)), 60)
                assert free[1] == "length"
                await engine.abort("late")
            try:
                async for _ in stream:
                    pass
            except Exception as exc:
                return exc
            return None
        finally:
            await engine.shutdown()

    error = asyncio.run(main())
    assert isinstance(error, RequestAbortedError)
    assert grammars.lookup(spec, "default") is not None  # compiled, then dropped unrun
    assert engine.engine.stats().num_requests_finished == 1  # only the free one ran


def test_an_in_process_front_compiles_into_the_engines_cache(folder: pathlib.Path) -> None:
    """The front shares the engine's compiler, even while its cache is empty (a compiler
    has a length, so an empty one is falsy): a grammar the gateway prepared is a hit when
    the engine takes the request, compiled once, on one set of threads."""
    engine = LLMEngine.from_options(str(folder), num_blocks=64, attention_backend="torch")
    try:
        assert len(engine.grammars) == 0
        front = AsyncEngine(engine)
        spec = StructuredSpec("regex", "[a-c]{3}-[0-9]{2}")
        asyncio.run(front.prepare_structured(spec, "tenant-a"))
        assert engine.grammars.lookup(spec, "tenant-a") is not None
        assert engine.grammars.num_compiles == 1
    finally:
        engine.grammars.shutdown()
