"""Prompt lookup: draft tokens copied from the request's own earlier text.

The last n tokens of the sequence (n from `max_n` down to `min_n`) are looked up
in its own prompt and output; the tokens that followed their most recent earlier
occurrence are the draft. Output that quotes, edits or summarises its input
repeats long runs of it, which is where this pays.
"""

from __future__ import annotations

from array import array

from engine.sequence import Sequence

_ITEM = array("i").itemsize


class NgramProposer:
    """Proposes from the sequence's own tokens only (never another request's)."""

    def __init__(self, *, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, not {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, seqs: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        """Up to k draft tokens per sequence; empty where no suffix recurs."""
        return {seq.seq_id: self.lookup(seq.all_token_ids, k) for seq, k in seqs}

    def release(self, seq_id: str) -> None:
        """Nothing to forget: lookups keep no state between steps."""

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """The k tokens after the most recent earlier occurrence of the longest recurring
        suffix of `tokens` (n from max_n down to min_n); [] when none recurs."""
        if k < 1 or len(tokens) <= self.min_n:
            return []
        # A C-level byte search over the packed ids: a step looks up every speculating
        # sequence, and a Python scan of a long prompt would cost more than the step saves.
        packed = array("i", tokens).tobytes()
        # The most recent occurrence with k tokens after it, longest suffix first; else
        # (a run that only began to repeat) the most recent one with any after it.
        for after in (k, 1):
            for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
                at = _rfind_aligned(packed, packed[-n * _ITEM :], len(packed) - after * _ITEM)
                if at >= 0:
                    return tokens[at + n : at + n + k]
        return []


def _rfind_aligned(packed: bytes, pattern: bytes, end: int) -> int:
    """The token index of the last occurrence of `pattern` inside packed[:end] that
    starts on a token boundary (not inside two tokens' bytes); -1 if none."""
    while end >= len(pattern):
        at = packed.rfind(pattern, 0, end)
        if at < 0:
            return -1
        if at % _ITEM == 0:
            return at // _ITEM
        end = at + len(pattern) - 1
    return -1
