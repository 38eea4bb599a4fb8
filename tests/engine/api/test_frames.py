"""engine.fronts.frames: messages cut back out of a byte stream, however the bytes arrive."""

from __future__ import annotations

import dataclasses

import pytest

from engine.fronts.frames import FrameDecoder, encode_frame
from engine.outputs import CompletionDelta, RequestMetrics, StreamEvent

MESSAGES: list[object] = [
    {"kind": "add", "ids": list(range(300))},
    "x" * 70_000,
    ("abort", 7),
    None,
]


def test_one_chunk_gives_every_message_in_order() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"".join(encode_frame(m) for m in MESSAGES)) == MESSAGES
    assert decoder.pending_bytes == 0


@pytest.mark.parametrize("chunk", [1, 7, 8, 9, 4096])
def test_split_bytes_give_each_message_once_it_is_whole(chunk: int) -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    decoder = FrameDecoder()
    got: list[object] = []
    for start in range(0, len(stream), chunk):
        got.extend(decoder.feed(stream[start : start + chunk]))
    assert got == MESSAGES
    assert decoder.pending_bytes == 0


def test_a_partial_message_waits_for_its_rest() -> None:
    frame = encode_frame({"a": 1})
    decoder = FrameDecoder()
    assert decoder.feed(frame[:-1]) == []
    assert decoder.pending_bytes == len(frame) - 1
    assert decoder.feed(frame[-1:] + frame[:3]) == [{"a": 1}]
    assert decoder.pending_bytes == 3


def test_with_prompt_is_replace_with_every_other_field_kept() -> None:
    event = StreamEvent(
        "r1",
        (CompletionDelta(index=0, text="hi", token_ids=(5,), logprobs=None, finish_reason="stop"),),
        (),
        3,
        True,
        RequestMetrics(1.0, 1.5, 2.0, 3.0, num_preemptions=1),
    )
    assert event.with_prompt((1, 2)) == dataclasses.replace(event, prompt_token_ids=(1, 2))
