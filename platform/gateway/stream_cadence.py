"""A tenant's stream cadence: streamed text in chunks of exactly N tokens.

With speculative decoding one engine step emits as many tokens as the draft got right,
so how many tokens each streamed chunk holds, and when it arrives, tells how
predictable the text was, and through that something of the text itself (Wei et al.,
arXiv 2411.01076). A tenant whose policy is `fixed:N` gets its streamed text re-chunked
here, between the engine's events and the route that renders them:

- each chunk holds exactly N output tokens (the last of a choice may hold fewer);
- at most one chunk per choice goes out per engine event, so the chunks' timing is the
  engine's step rhythm, never how many tokens a step produced; tokens beyond N wait
  for the next event;
- at the end of a choice the rest goes out at once, N tokens a chunk, the last one
  carrying the finish reason.

A chunk's text is the text of its tokens: a replica of the engine's incremental
detokenizer (same prompt context, stop strings and special-token rule) says how many
characters the chunk's tokens release, and that many are taken from the engine's own
text, so the streamed text is exactly the engine's (a character split over tokens
goes out with the token that completes it, as the engine releases it). Logprobs go
with their tokens. Usage is counted upstream, on the engine's events, and is unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionDelta, PositionLogprobs, StreamEvent
from engine_hop.client import TokenizerLike


@dataclass(frozen=True)
class Cadence:
    """How one request's streams are re-chunked: N tokens a chunk, and what it takes to
    find each chunk's text (the request's tokenizer, stop strings and special-token rule).
    """

    tokens: int
    tokenizer: TokenizerLike
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True


class _Decoding:
    """The gateway's tokenizer as the detokenizer calls it (with skip_special_tokens)."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self._tokenizer: Any = tokenizer

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text, under the request's special-token rule where the tokenizer
        takes one (every tokenizer the engine serves does)."""
        try:
            return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))
        except TypeError:
            return str(self._tokenizer.decode(list(ids)))


@dataclass
class ChoicePacer:
    """One choice's buffer: engine tokens, logprobs and text not yet sent.

    `detok` None: the chunks' text is the engine text as it comes (a unit test's choice
    without a tokenizer); otherwise each chunk takes the characters its tokens release.
    """

    tokens: int
    detok: IncrementalDetokenizer | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    with_logprobs: bool = False
    text: str = ""  # engine text received and not yet sent
    owed: int = 0  # characters the tokens sent so far released and that were not yet sent

    def feed(self, delta: CompletionDelta) -> list[CompletionDelta]:
        """The chunks to send for this engine delta: at most one while the choice runs;
        at its end (a finish reason) everything left, N tokens a chunk."""
        self.ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.with_logprobs = True
            self.logprobs.extend(delta.logprobs)
        self.text += delta.text
        if delta.finish_reason is not None:
            return self._drain(delta.index, delta.finish_reason)
        if len(self.ids) < self.tokens:
            return []
        return [self._take(delta.index, self.tokens, finish_reason=None, last=False)]

    def _drain(self, index: int, finish_reason: str) -> list[CompletionDelta]:
        out: list[CompletionDelta] = []
        while len(self.ids) > self.tokens:
            out.append(self._take(index, self.tokens, finish_reason=None, last=False))
        out.append(self._take(index, len(self.ids), finish_reason=finish_reason, last=True))
        return out

    def _take(
        self, index: int, count: int, *, finish_reason: str | None, last: bool
    ) -> CompletionDelta:
        ids, self.ids = self.ids[:count], self.ids[count:]
        logprobs, self.logprobs = self.logprobs[:count], self.logprobs[count:]
        if last or self.detok is None:
            size = len(self.text)  # the end (or no tokenizer): every character received
        else:
            # Token by token, as the engine pushes them: a batch would hold back a
            # whole window behind one unfinished character.
            self.owed += sum(len(self.detok.push((t,))) for t in ids)
            size = min(self.owed, len(self.text))
        text, self.text = self.text[:size], self.text[size:]
        self.owed = max(0, self.owed - size)
        return CompletionDelta(
            index=index,
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(logprobs) if self.with_logprobs else None,
            finish_reason=finish_reason,
        )


def _pacer(cadence: Cadence, prompt_token_ids: Sequence[int]) -> ChoicePacer:
    detok = IncrementalDetokenizer(
        _Decoding(cadence.tokenizer),
        prompt_token_ids=prompt_token_ids,
        skip_special_tokens=cadence.skip_special_tokens,
        stop=cadence.stop,
    )
    return ChoicePacer(tokens=cadence.tokens, detok=detok)


async def paced_events(
    events: AsyncIterator[tuple[int, StreamEvent]], cadence: Cadence
) -> AsyncIterator[tuple[int, StreamEvent]]:
    """`events` ((prompt index, engine event) pairs) re-chunked to `cadence`.

    Each engine event yields at most one event, with at most one delta per choice, and
    none when no choice has a chunk ready. The final drain of a choice may put several
    deltas of the same choice in one event: they go out back to back, in order.
    """
    pacers: dict[tuple[int, int], ChoicePacer] = {}
    try:
        async for prompt_index, event in events:
            deltas: list[CompletionDelta] = []
            for d in event.deltas:
                key = (prompt_index, d.index)
                pacer = pacers.get(key)
                if pacer is None:
                    pacer = pacers[key] = _pacer(cadence, event.prompt_token_ids)
                deltas.extend(pacer.feed(d))
            if deltas:
                yield (
                    prompt_index,
                    StreamEvent(
                        event.request_id,
                        tuple(deltas),
                        event.prompt_token_ids,
                        event.num_cached_tokens,
                        event.finished,
                        event.metrics,
                    ),
                )
    finally:
        # A client that leaves closes this generator; close the engine's side at once
        # too (its own cleanup cancels the pumps), not at garbage collection.
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
