"""The only contract between the scheduler and the model runner."""

from __future__ import annotations

from dataclasses import dataclass

from engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step: `num_new_tokens` tokens from `num_computed_tokens` on."""

    seq: Sequence
    start: int  # num_computed_tokens when scheduled
    num_new_tokens: int  # the draft tokens included
    # Draft tokens after the last known one, scored in the same pass (speculative
    # decoding); `num_new_tokens` counts them. Empty for every other row.
    spec: tuple[int, ...] = ()

    @property
    def end(self) -> int:
        """Token index one past the last token computed this step (drafts included)."""
        return self.start + self.num_new_tokens

    @property
    def known_end(self) -> int:
        """One past the last known (not draft) token this step computes."""
        return self.end - len(self.spec)

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last known token, so a new one is sampled."""
        return self.known_end == self.seq.num_tokens

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of a prompt chunk this row computes (0 for a decode or verify row)."""
        known = self.num_new_tokens - len(self.spec)
        return known if known > 1 else 0


@dataclass(frozen=True)
class SchedulerOutput:
    """What to run this step, in batch order, plus bookkeeping for metrics."""

    scheduled: tuple[ScheduledSequence, ...]
    num_batched_tokens: int
    preempted: tuple[Sequence, ...] = ()

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to run."""
        return not self.scheduled
