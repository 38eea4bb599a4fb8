"""The completions pieces both ends of the hop share: collection, SSE framing and chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import orjson

from engine.errors import EngineOverloadedError
from engine.outputs import CompletionDelta, PositionLogprobs, StreamEvent, TokenLogprob
from engine_hop.collect import Collected, collect, completion_body
from engine_hop.sse import DONE, event_chunks, openai_chunk_encoder, sse_chunk
from engine_hop.wire import event_to_compact

LP = PositionLogprobs(TokenLogprob(1, -0.5, "a"), (TokenLogprob(1, -0.5, "a"),))


def _event(
    deltas: tuple[CompletionDelta, ...], *, cached: int = 0, done: bool = False
) -> StreamEvent:
    return StreamEvent("r-1", deltas, (5, 6, 7), cached, done)


EVENTS = (
    _event(
        (
            CompletionDelta(0, "he", (1, 2), (LP, LP), None),
            CompletionDelta(1, "x", (3,), None, None),
        )
    ),
    _event((CompletionDelta(1, "y", (4,), None, "length"),), cached=2),
    _event((CompletionDelta(0, "llo", (5,), (LP,), "stop"),), cached=2, done=True),
)


async def _gen(
    *events: StreamEvent, fail: Exception | None = None
) -> AsyncGenerator[StreamEvent, None]:
    for event in events:
        yield event
    if fail is not None:
        raise fail


def test_collected_gathers_choices_tokens_and_cached() -> None:
    collected = asyncio.run(collect(_gen(*EVENTS)))
    texts = [(c.index, c.text, c.finish_reason, len(c.logprobs)) for c in collected.ordered()]
    assert texts == [(0, "hello", "stop", 3), (1, "xy", "length", 0)]
    assert (collected.completion_tokens, collected.cached_tokens) == (5, 2)


def test_collected_numbers_choices_over_prompts_and_keeps_silent_ones() -> None:
    collected = Collected(6)  # 3 prompts x n=2
    collected.add(_event((CompletionDelta(1, "b", (1,), None, "stop"),)), first=4)
    assert [(c.index, c.text, c.finish_reason) for c in collected.ordered()] == [
        (0, "", None),
        (1, "", None),
        (2, "", None),
        (3, "", None),
        (4, "", None),
        (5, "b", "stop"),
    ]


def test_completion_body_is_openai_text_completion() -> None:
    collected = asyncio.run(collect(_gen(*EVENTS)))
    body = completion_body("r-1", "m", 3, collected)
    assert isinstance(body.pop("created"), int)
    assert body == {
        "id": "r-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            {"index": 0, "text": "hello", "logprobs": None, "finish_reason": "stop"},
            {"index": 1, "text": "xy", "logprobs": None, "finish_reason": "length"},
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 5,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }


async def _all(chunks: AsyncGenerator[bytes, None]) -> list[bytes]:
    return [chunk async for chunk in chunks]


def test_event_chunks_ride_done_with_the_last_event() -> None:
    chunks = asyncio.run(_all(event_chunks(_gen(*EVENTS), event_to_compact)))
    assert len(chunks) == 3
    assert chunks[-1].endswith(DONE) and not chunks[0].endswith(DONE)
    assert chunks[0] == sse_chunk(event_to_compact(EVENTS[0]))


def test_event_chunks_end_an_unfinished_stream_with_done() -> None:
    chunks = asyncio.run(_all(event_chunks(_gen(EVENTS[0]), event_to_compact)))
    assert chunks[-1] == DONE and len(chunks) == 2


def test_event_chunks_say_a_failure_in_band() -> None:
    failing = _gen(EVENTS[0], fail=EngineOverloadedError("busy"))
    chunks = asyncio.run(_all(event_chunks(failing, event_to_compact)))
    assert chunks[-1].endswith(DONE)
    error = orjson.loads(chunks[-1].removesuffix(DONE).removeprefix(b"data: "))
    assert "error" in error and error["error"]["message"]


def test_openai_chunk_carries_the_event() -> None:
    chunk = openai_chunk_encoder("r-1", "m")(EVENTS[2])
    assert chunk["object"] == "text_completion" and chunk["model"] == "m"
    assert chunk["choices"] == [
        {"index": 0, "text": "llo", "logprobs": None, "finish_reason": "stop"}
    ]
    assert chunk["cloister"]["finished"] is True
