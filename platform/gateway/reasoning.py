"""Reasoning models' thinking, apart from their answer (`reasoning_content`).

Qwen3 (and the models that copied its format) think first, between `<think>` and
`</think>`, then answer. As vLLM's reasoning parsers do, the thinking is returned in
`reasoning_content` and stripped from `content`; output that does not open with
`<think>` is all content, and output that never closes it is all thinking.

    text:   "<think>\\nThe user greets me.\\n</think>\\n\\nHello!"
    split:  reasoning "\\nThe user greets me.\\n", content "Hello!"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.tools.streaming import partial_suffix

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

ReasoningSetting = Literal["auto", "qwen3", "none"]


def reasoning_enabled(setting: ReasoningSetting, chat_template: str | None) -> bool:
    """The operator's `reasoning_parser` setting; `auto`: on when the model's chat
    template writes thinking blocks (Qwen3's does)."""
    if setting == "auto":
        return bool(chat_template) and THINK_OPEN in (chat_template or "")
    return setting == "qwen3"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole output."""
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return None, text
    reasoning, closed, content = stripped[len(THINK_OPEN) :].partition(THINK_CLOSE)
    return reasoning, content.lstrip("\n") if closed else ""


@dataclass(frozen=True)
class ReasoningDelta:
    """Thinking text, for the message's `reasoning_content`."""

    text: str


@dataclass(frozen=True)
class AnswerDelta:
    """Answer text, for the message's content (or the tool-call parser)."""

    text: str


class StreamingReasoningSplitter:
    """`split_reasoning` over text deltas: thinking and answer deltas as they come.

    Text waits only while it may still be the opening marker (at the start) or part
    of the closing one, so the concatenated deltas equal the whole split.
    """

    def __init__(self) -> None:
        self._state: Literal["start", "thinking", "after_close", "answer"] = "start"
        self._held = ""

    def feed(self, text: str) -> list[ReasoningDelta | AnswerDelta]:
        """The deltas `text` completes (possibly none, while a marker may be forming)."""
        self._held += text
        out: list[ReasoningDelta | AnswerDelta] = []
        while True:
            if self._state == "start":
                head = self._held.lstrip()
                if head.startswith(THINK_OPEN):
                    self._state, self._held = "thinking", head[len(THINK_OPEN) :]
                    continue
                if THINK_OPEN.startswith(head):  # empty, or the marker still forming
                    return out
                self._state = "answer"
                continue
            if self._state == "thinking":
                before, closed, after = self._held.partition(THINK_CLOSE)
                if closed:
                    if before:
                        out.append(ReasoningDelta(before))
                    self._state, self._held = "after_close", after
                    continue
                keep = partial_suffix(self._held, THINK_CLOSE)
                ready = self._held[: len(self._held) - keep]
                if ready:
                    out.append(ReasoningDelta(ready))
                self._held = self._held[len(ready) :]
                return out
            if self._state == "after_close":
                # The newlines a template puts between thinking and answer are dropped.
                self._held = self._held.lstrip("\n")
                if not self._held:
                    return out
                self._state = "answer"
                continue
            if self._held:
                out.append(AnswerDelta(self._held))
            self._held = ""
            return out

    def finish(self) -> list[ReasoningDelta | AnswerDelta]:
        """What is still held once the output ends."""
        held, self._held = self._held, ""
        if not held or self._state == "after_close":
            return []
        if self._state == "thinking":
            return [ReasoningDelta(held)]
        return [AnswerDelta(held)]
