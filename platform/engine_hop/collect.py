"""A non-streamed completion: a request's events gathered into whole choices.

Both ends of the hop answer a request sent without `stream` this way: the gateway
(gateway.generation, over its prompts times n) and the engine server (its plain
OpenAI body, `completion_body`). A choice is numbered as OpenAI numbers them: the
engine's sample index, plus `first` for the prompt's first choice (prompt x n).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engine.outputs import CompletionDelta, PositionLogprobs, StreamEvent


@dataclass
class ChoiceState:
    """One choice accumulated from its deltas."""

    index: int
    text: str = ""
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, delta: CompletionDelta) -> None:
        """Appends one delta's text and logprobs; its finish reason, if any, is the choice's."""
        self.text += delta.text
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason


class Collected:
    """A request's choices so far, with the tokens it generated and found cached."""

    __slots__ = ("cached_tokens", "choices", "completion_tokens")

    def __init__(self, choices: int = 0) -> None:
        """`choices`: how many choices the request has (0: those its events name)."""
        self.choices = {i: ChoiceState(index=i) for i in range(choices)}
        self.completion_tokens = 0
        self.cached_tokens = 0

    def add(self, event: StreamEvent, first: int = 0) -> None:
        """One event's deltas, the first sample's choice being `first`."""
        self.cached_tokens = event.num_cached_tokens
        for delta in event.deltas:
            index = first + delta.index
            choice = self.choices.get(index)
            if choice is None:
                choice = self.choices[index] = ChoiceState(index=index)
            choice.add(delta)
            self.completion_tokens += len(delta.token_ids)

    def ordered(self) -> list[ChoiceState]:
        """The choices by index."""
        return [self.choices[i] for i in sorted(self.choices)]


async def collect(events: AsyncIterator[StreamEvent]) -> Collected:
    """One request's events, gathered until its stream ends (an engine error propagates)."""
    collected = Collected()
    async for event in events:
        collected.add(event)
    return collected


def completion_body(
    request_id: str, model: str, prompt_tokens: int, collected: Collected
) -> dict[str, Any]:
    """The OpenAI `text_completion` body of a collected request (without logprobs)."""
    completion_tokens = collected.completion_tokens
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
            for c in collected.ordered()
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": collected.cached_tokens},
        },
    }
