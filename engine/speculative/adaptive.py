"""Per-sequence draft length: k follows acceptance, and a sequence whose drafts keep
failing stops speculating for a while (each failed pause lasts longer)."""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest verify row in a sequence's acceptance average.
EMA_WEIGHT = 0.3
# Below this average acceptance (after MIN_VERIFIES rows) a sequence stops speculating.
ACCEPTANCE_FLOOR = 0.3
MIN_VERIFIES = 4
# Steps a failing sequence sits out before it tries k = 1 again; doubled each time.
FIRST_PAUSE_STEPS = 16
MAX_PAUSE_STEPS = 512


@dataclass
class _SeqState:
    k: int
    average: float | None = None
    verifies: int = 0
    paused_until: int = 0
    pause: int = FIRST_PAUSE_STEPS


class AdaptiveK:
    """How many draft tokens each sequence asks for at most, from its own record."""

    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self._seqs: dict[str, _SeqState] = {}

    def k_for(self, seq_id: str, step: int) -> int:
        """Draft tokens to propose for `seq_id` at engine step `step` (0: none)."""
        state = self._seqs.get(seq_id)
        if state is None:
            return self.k_max
        return 0 if step < state.paused_until else state.k

    def observe(self, seq_id: str, proposed: int, accepted: int, step: int) -> None:
        """Records one verify row: `accepted` of `proposed` draft tokens taken."""
        if proposed <= 0:
            return
        state = self._seqs.setdefault(seq_id, _SeqState(self.k_max))
        rate = accepted / proposed
        state.average = (
            rate if state.average is None else (1 - EMA_WEIGHT) * state.average + EMA_WEIGHT * rate
        )
        state.verifies += 1
        # All taken: try one more next time; else ask for one past what was taken.
        state.k = min(self.k_max, state.k + 1) if accepted == proposed else max(1, accepted + 1)
        if state.verifies >= MIN_VERIFIES and state.average < ACCEPTANCE_FLOOR:
            state.paused_until = step + state.pause
            state.pause = min(MAX_PAUSE_STEPS, state.pause * 2)
            state.average, state.verifies, state.k = None, 0, 1

    def release(self, seq_id: str) -> None:
        """Forgets a finished sequence."""
        self._seqs.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._seqs)
