"""Draft proposers for tests of speculative decoding."""

from __future__ import annotations

from engine.sequence import Sequence
from engine.speculative.ngram import NgramProposer


class SometimesWrong:
    """Prompt lookup with every other draft spoiled after its first token, and a made-up
    draft where lookup finds none: a random model's repetitive output would otherwise
    accept every draft, and the rollback path would go untested."""

    def __init__(self) -> None:
        self.lookup = NgramProposer()
        self.calls = 0

    def propose(self, seqs: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for seq, k in seqs:
            self.calls += 1
            draft = self.lookup.lookup(seq.all_token_ids, k)
            if not draft:
                draft = [(seq.all_token_ids[-1] * 7 + 3) % 40000 + 100] * k
            elif self.calls % 2 and len(draft) > 1:
                draft[1] = (draft[1] + 1) % 49152
            out[seq.seq_id] = draft
        return out

    def release(self, seq_id: str) -> None:
        """Prompt lookup keeps no per-sequence state."""
