"""Incremental detokenization with stop strings: token ids in, safe text deltas out.

Two things make a naive `decode(new_token)` wrong while streaming:

1. Byte-level BPE splits one character (emoji, CJK) over several tokens; a
   prefix of them decodes to U+FFFD. Such text is held back until the
   character completes.
2. A stop string may arrive over several tokens; text that could still be the
   start of a stop string is held back until it either completes (then it is
   cut) or diverges (then it is released).

Decoding uses vLLM's two offsets into the token ids, so each step decodes a
short window and never the whole output:

    ids:   ... p p p | o o o o | n n
                     ^prefix   ^read
    prefix_text = decode(ids[prefix:read])   (already emitted, kept as context)
    new_text    = decode(ids[prefix:])
    delta       = new_text[len(prefix_text):]   unless it ends in U+FFFD

The context before `read` matters: tokenizers may decode a token differently
at the start of a text than after another token. The last few prompt tokens
seed that context; they are never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"
# Prompt tokens kept as decoding context for the first output tokens (vLLM uses 5).
_PROMPT_CONTEXT = 5


class DecodingTokenizer(Protocol):
    """What the detokenizer needs from `engine.model.tokenizer.Tokenizer`."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text."""
        ...


class IncrementalDetokenizer:
    """Turns one sample's output tokens into text, streaming only what is final.

    `push` returns text that will never change: no partial UTF-8 character and
    no possible start of a stop string. When a stop string appears the text
    is cut before it (after it when `include_stop_str_in_output`), `stopped`
    becomes True, `stop_reason` holds the string, and later calls return "".
    If several stop strings match, the one starting earliest wins.
    """

    def __init__(
        self,
        tokenizer: DecodingTokenizer,
        *,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool,
        stop: Sequence[str],
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stops = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        context = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._pending = ""  # decoded, complete characters, not yet emitted
        self._chunks: list[str] = []
        self._stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    @property
    def stopped(self) -> bool:
        """True once a stop string was found."""
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the text, if any."""
        return self._stop_reason

    def push(self, token_ids: Sequence[int]) -> str:
        """Adds new output tokens; returns the newly safe text (maybe "")."""
        if self.stopped or not token_ids:
            return ""
        self._ids.extend(token_ids)
        prefix_text, new_text = self._decode_window()
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            self._pending += new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release(final=False)

    def flush(self) -> str:
        """Releases everything held back, at the end of the sample.

        Text held for a stop string that never completed is emitted. Bytes of a
        character that never completed are emitted as the tokenizer decodes them
        (usually U+FFFD), so that `text` ends the way a full decode would.
        A stop string completed by that last text still cuts it.
        """
        if self.stopped:
            return ""
        prefix_text, new_text = self._decode_window()
        if len(new_text) > len(prefix_text):
            self._pending += new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        return self._release(final=True)

    def _decode_window(self) -> tuple[str, str]:
        window = self._ids[self._prefix_offset :]
        split = self._read_offset - self._prefix_offset
        skip = self._skip_special_tokens
        prefix_text = self._tokenizer.decode(window[:split], skip_special_tokens=skip)
        new_text = self._tokenizer.decode(window, skip_special_tokens=skip)
        return prefix_text, new_text

    def _release(self, *, final: bool) -> str:
        """Emits the pending text that is safe w.r.t. stop strings."""
        pending = self._pending
        if not self._stops:  # the common case: nothing to look for or hold back
            self._pending = ""
            return self._emit(pending)
        match = self._find_stop(pending)
        if match is not None:
            start, stop = match
            end = start + len(stop) if self._include_stop else start
            self._stop_reason = stop
            self._pending = ""
            return self._emit(pending[:end])
        hold = 0 if final else self._stop_prefix_length(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return self._emit(pending[: len(pending) - hold])

    def _find_stop(self, pending: str) -> tuple[int, str] | None:
        # Emitted text never holds the start of a stop string (see _release),
        # so a match can only start inside `pending`.
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = pending.find(stop)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _stop_prefix_length(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that starts some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _emit(self, text: str) -> str:
        if text:
            self._chunks.append(text)
        return text
