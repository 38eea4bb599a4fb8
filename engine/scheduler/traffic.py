"""Traffic classes in the scheduler: interactive work first, batch work in what it leaves.

The rules (issue 42), each a few lines in engine/scheduler/scheduler.py:
- admission: a batch sequence is admitted only while no interactive sequence waits;
- running: a batch prompt chunk sits the step out while an interactive sequence waits
  (batch decodes go on, one token each), so a newcomer's chunk finds the budget free;
- preemption: interactive work takes seats and KV blocks from the newest running batch
  sequence first; batch work preempts only batch work (itself, when no other runs).
Within each class the tenants' fair order, KV shares and quotas are as before, and a
scheduler that never sees a batch sequence schedules exactly as it did without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from engine.sequence import Sequence


def interactive_waiting(waiting: Iterable[Sequence]) -> int:
    """How many waiting sequences are interactive."""
    return sum(1 for seq in waiting if not seq.batch)


def newest_batch(running: Seq[Sequence]) -> Sequence | None:
    """The most recently admitted running batch sequence, if any."""
    return next((seq for seq in reversed(running) if seq.batch), None)


def same_class_or_below(running: list[Sequence], requester: Sequence) -> list[Sequence]:
    """The running sequences `requester` may preempt: any, for interactive work; only
    batch sequences (itself included) for batch work."""
    return [seq for seq in running if seq.batch] if requester.batch else running
