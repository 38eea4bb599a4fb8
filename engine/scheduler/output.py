"""The only contract between the scheduler and the model runner."""

from __future__ import annotations

from dataclasses import dataclass

from engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step: `num_new_tokens` tokens from `num_computed_tokens` on."""

    seq: Sequence
    start: int  # num_computed_tokens when scheduled
    num_new_tokens: int

    @property
    def end(self) -> int:
        """Token index one past the last token computed this step."""
        return self.start + self.num_new_tokens

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last known token, so a new one is sampled."""
        return self.end == self.seq.num_tokens


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
