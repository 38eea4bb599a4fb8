"""Thinking apart from the answer: the whole-output split and the streaming one agree."""

from __future__ import annotations

import random

import pytest

from gateway.reasoning import (
    AnswerDelta,
    ReasoningDelta,
    StreamingReasoningSplitter,
    reasoning_enabled,
    split_reasoning,
)

CASES = [
    ("<think>\nThe user greets me.\n</think>\n\nHello!", "\nThe user greets me.\n", "Hello!"),
    ("Hello, no thinking here.", None, "Hello, no thinking here."),
    ("  <think>short</think>answer", "short", "answer"),
    ("<think>cut off by max_tokens", "cut off by max_tokens", ""),
    ("<think></think>\n\n", "", ""),
    ("I say <think> later", None, "I say <think> later"),
    ("<thin", None, "<thin"),
    ("<think>a < b </thin k</think>x</think>y", "a < b </thin k", "x</think>y"),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_split_reasoning(text: str, reasoning: str | None, content: str) -> None:
    assert split_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
@pytest.mark.parametrize("seed", range(6))
def test_streaming_in_any_pieces_gives_the_same_split(
    text: str, reasoning: str | None, content: str, seed: int
) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 6))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    splitter = StreamingReasoningSplitter()
    items = [item for piece in pieces for item in splitter.feed(piece)] + splitter.finish()
    thought = "".join(i.text for i in items if isinstance(i, ReasoningDelta))
    answer = "".join(i.text for i in items if isinstance(i, AnswerDelta))
    assert thought == (reasoning or "")
    assert answer == content
    assert all(i.text for i in items)  # no empty deltas


def test_thinking_streams_before_the_output_ends() -> None:
    splitter = StreamingReasoningSplitter()
    assert splitter.feed("<thi") == []
    assert splitter.feed("nk>Let me") == [ReasoningDelta("Let me")]
    assert splitter.feed(" see.</th") == [ReasoningDelta(" see.")]
    assert splitter.feed("ink>\n\nHi") == [AnswerDelta("Hi")]


def test_auto_follows_the_chat_template() -> None:
    qwen3 = "{% if enable_thinking %}<think>\n\n</think>{% endif %}<|im_start|>"
    assert reasoning_enabled("auto", qwen3)
    assert not reasoning_enabled("auto", "<|im_start|>{{ message }}")
    assert not reasoning_enabled("auto", None)
    assert reasoning_enabled("qwen3", None)
    assert not reasoning_enabled("none", qwen3)
