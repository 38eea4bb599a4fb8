"""The stream-cadence chunker (gateway.stream_cadence), without a server.

Whatever sizes the engine's events have: every chunk holds exactly N tokens but the
last of a choice; an event releases at most one chunk per choice (the end of a choice
drains the rest); tokens, logprobs and text come out in order and complete; a chunk's
text is what its tokens release (a character split over tokens goes with the token
that completes it, and stop strings cut it as the engine does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionDelta, PositionLogprobs, StreamEvent, TokenLogprob
from gateway.stream_cadence import Cadence, ChoicePacer, paced_events
from tenancy.errors import InvalidValueError
from tenancy.validation import check_stream_cadence, stream_cadence_tokens
from tests.utils.byte_tokenizer import ByteTokenizer

PROMPT = tuple(b"<user>hi\n<assistant>")


def _lp(token_id: int) -> PositionLogprobs:
    return PositionLogprobs(TokenLogprob(token_id, -0.25, chr(token_id % 128)))


def _engine_events(
    ids: Sequence[int],
    sizes: Sequence[int],
    *,
    stop: tuple[str, ...] = (),
    finish: str = "length",
    logprobs: bool = True,
) -> list[StreamEvent]:
    """The events the engine would stream for `ids` cut into steps of `sizes` tokens,
    each step's text from the engine's own incremental detokenizer."""
    detok = IncrementalDetokenizer(
        _ByteDecoding(), prompt_token_ids=PROMPT, skip_special_tokens=True, stop=stop
    )
    events: list[StreamEvent] = []
    at, step = 0, 0
    while at < len(ids):
        size = max(1, sizes[step % len(sizes)])
        step_ids = tuple(ids[at : at + size])
        at, step = at + size, step + 1
        text = "".join(detok.push([i]) for i in step_ids)
        last = at >= len(ids)
        if last:
            text += detok.flush()
        delta = CompletionDelta(
            index=0,
            text=text,
            token_ids=step_ids,
            logprobs=tuple(_lp(i) for i in step_ids) if logprobs else None,
            finish_reason=finish if last else None,
        )
        events.append(StreamEvent("r", (delta,), PROMPT, 0, last))
    return events


class _ByteDecoding:
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return ByteTokenizer().decode(list(ids))


async def _aiter(events: list[StreamEvent]) -> AsyncIterator[tuple[int, StreamEvent]]:
    for event in events:
        yield 0, event


def _paced(events: list[StreamEvent], n: int, stop: tuple[str, ...] = ()) -> list[StreamEvent]:
    """The events the gateway renders for `events` under fixed:n (an engine event with
    no chunk ready yields none; `_per_event` counts per engine event)."""
    cadence = Cadence(tokens=n, tokenizer=ByteTokenizer(), stop=stop)

    async def run() -> list[StreamEvent]:
        return [e async for _, e in paced_events(_aiter(events), cadence)]

    return asyncio.run(run())


def _per_event(events: list[StreamEvent], n: int, stop: tuple[str, ...] = ()) -> list[int]:
    """How many chunks each engine event released."""
    cadence = Cadence(tokens=n, tokenizer=ByteTokenizer(), stop=stop)
    counts: list[int] = []

    async def run() -> None:
        source = _aiter(events)
        paced = paced_events(_counting(source, counts), cadence)
        async for _, e in paced:
            counts[-1] += len(e.deltas)

    asyncio.run(run())
    return counts


async def _counting(
    source: AsyncIterator[tuple[int, StreamEvent]], counts: list[int]
) -> AsyncIterator[tuple[int, StreamEvent]]:
    async for pair in source:
        counts.append(0)
        yield pair


def _chunks(paced: list[StreamEvent]) -> list[CompletionDelta]:
    return [d for e in paced for d in e.deltas]


def _check(ids: list[int], sizes: list[int], n: int, stop: tuple[str, ...] = ()) -> None:
    events = _engine_events(ids, sizes, stop=stop)
    chunks = _chunks(_paced(events, n, stop))
    # exactly N tokens a chunk, the last shorter (at least one token when there are any)
    assert all(len(c.token_ids) == n for c in chunks[:-1]), [len(c.token_ids) for c in chunks]
    assert 1 <= len(chunks[-1].token_ids) <= n
    # nothing lost, nothing reordered; logprobs follow their tokens
    assert [t for c in chunks for t in c.token_ids] == ids
    for c in chunks:
        assert c.logprobs is not None
        assert [p.chosen.token_id for p in c.logprobs] == list(c.token_ids)
    # the text is exactly the engine's
    assert "".join(c.text for c in chunks) == "".join(d.text for e in events for d in e.deltas)
    # only the last chunk says how the choice ended
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    # one chunk at most per engine event until the last event, which drains the rest
    counts = _per_event(events, n, stop)
    assert all(c <= 1 for c in counts[:-1]), counts
    assert sum(counts) == len(chunks)
    # each chunk's text is what the engine's detokenizer releases for exactly its tokens
    if not stop:
        detok = IncrementalDetokenizer(
            _ByteDecoding(), prompt_token_ids=PROMPT, skip_special_tokens=True, stop=()
        )
        for c in chunks[:-1]:
            assert c.text == "".join(detok.push([t]) for t in c.token_ids)


TEXT_IDS = list(b"Side channels leak through chunk sizes.")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 64])
@pytest.mark.parametrize("sizes", [[1], [3], [4], [5], [1, 9, 2, 4, 8], [16], [40]])
def test_exact_chunks_for_event_sizes(n: int, sizes: list[int]) -> None:
    _check(TEXT_IDS, sizes, n)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(min_size=1, max_size=40),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    n=st.integers(1, 9),
)
def test_exact_chunks_any_text_any_sizes(text: str, sizes: list[int], n: int) -> None:
    """Multi-byte characters (one token per UTF-8 byte here) split anywhere."""
    _check(list(text.encode()), sizes, n)


def test_a_character_split_over_chunks_goes_with_the_token_that_completes_it() -> None:
    ids = list("aé→b".encode())  # a, 2 bytes, 3 bytes, b: 7 tokens
    chunks = _chunks(_paced(_engine_events(ids, [7]), 2))
    assert [c.token_ids for c in chunks] == [tuple(ids[i : i + 2]) for i in range(0, 7, 2)]
    # "a"+1st byte of é | 2nd byte of é + 1st of → | 2nd, 3rd of → | b
    assert [c.text for c in chunks] == ["a", "é", "→", "b"]


def test_buffered_tokens_wait_for_the_next_event_then_drain_at_the_end() -> None:
    ids = list(b"abcdefghijklmnop")  # 16 tokens in steps of 8, 1, 1, 6
    events = _engine_events(ids, [8, 1, 1, 6])
    assert _per_event(events, 3) == [1, 1, 1, 3]  # 3 | 3 | 3 (7 waiting) | 3 3 1
    chunks = _chunks(_paced(events, 3))
    assert ["".join(map(chr, c.token_ids)) for c in chunks] == [
        "abc",
        "def",
        "ghi",
        "jkl",
        "mno",
        "p",
    ]
    assert [c.text for c in chunks] == ["abc", "def", "ghi", "jkl", "mno", "p"]


def test_stop_strings_cut_the_text_as_the_engine_does() -> None:
    ids = list(b"hello STOP tail")
    _check(ids, [2, 5, 1], 3, stop=("STOP",))
    chunks = _chunks(_paced(_engine_events(ids, [2, 5, 1], stop=("STOP",)), 3, ("STOP",)))
    assert "".join(c.text for c in chunks) == "hello "


def test_a_finish_with_no_tokens_left_is_a_chunk_of_its_own() -> None:
    """An engine that ends a choice in an event without tokens (EOS carries none): the
    finish reason still goes out, with whatever text the engine flushed."""
    pacer = ChoicePacer(tokens=2)
    out = pacer.feed(CompletionDelta(0, "ab", (97, 98), None, None))
    assert [(c.token_ids, c.text) for c in out] == [((97, 98), "ab")]
    out = pacer.feed(CompletionDelta(0, "", (), None, "stop"))
    assert [(c.token_ids, c.text, c.finish_reason) for c in out] == [((), "", "stop")]
    assert out[0].logprobs is None  # no logprobs asked, none made up


def test_choices_are_paced_apart_one_chunk_each_per_event() -> None:
    """n > 1: each choice has its own buffer; an event releases one chunk per choice."""
    deltas = (
        CompletionDelta(0, "abcde", tuple(b"abcde"), None, None),
        CompletionDelta(1, "xy", tuple(b"xy"), None, None),
    )
    end = (
        CompletionDelta(0, "f", tuple(b"f"), None, "length"),
        CompletionDelta(1, "zw", tuple(b"zw"), None, "length"),
    )
    events = [StreamEvent("r", deltas, PROMPT, 0, False), StreamEvent("r", end, PROMPT, 0, True)]
    paced = _paced(events, 2)
    assert [[(d.index, d.text) for d in e.deltas] for e in paced] == [
        [(0, "ab"), (1, "xy")],
        [(0, "cd"), (0, "ef"), (1, "zw")],
    ]


@pytest.mark.parametrize("value", ["token", "fixed:1", "fixed:4", "fixed:64"])
def test_good_cadences(value: str) -> None:
    assert check_stream_cadence(value) == value
    assert stream_cadence_tokens(value) == (None if value == "token" else int(value[6:]))


@pytest.mark.parametrize(
    "value",
    [
        "fixed:0",
        "fixed:-1",
        "fixed:65",
        "fixed:100000",
        "fixed:abc",
        "fixed:",
        "fixed:04",
        "fixed: 4",
        "fixed:4 ",
        "FIXED:4",
        "chunky",
        "",
        None,
        4,
        True,
        ["fixed:4"],
    ],
)
def test_bad_cadences_name_the_field(value: object) -> None:
    with pytest.raises(InvalidValueError, match="stream_cadence"):
        check_stream_cadence(value)
    if isinstance(value, str):
        assert stream_cadence_tokens(value) is None  # a bad stored value streams per token
