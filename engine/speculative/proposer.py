"""What a draft-token proposer is: the verifier only ever sees this protocol."""

from __future__ import annotations

from typing import Protocol

from engine.sequence import Sequence


class Proposer(Protocol):
    """Proposes up to `k` tokens to follow a sequence's known tokens.

    A proposer reads the one sequence it is given and nothing else: proposals drawn
    from another request's tokens would carry that request's content into this one's
    timing and output lengths. An EAGLE-style head or a draft model implements the
    same call over the same sequences.
    """

    def propose(self, seqs: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        """Draft tokens by seq_id for each (sequence, k) pair; an empty list: no guess."""
        ...

    def release(self, seq_id: str) -> None:
        """Forgets what the proposer kept for a sequence that ended."""
        ...
