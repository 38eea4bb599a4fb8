"""Traffic classes in the scheduler: interactive work first, batch work in what it leaves.

The rules (issue 42), each a few lines in engine/scheduler/scheduler.py:
- admission: a batch sequence is admitted only while no interactive sequence waits;
- running: a batch prompt chunk sits the step out while an interactive sequence waits
  (batch decodes go on, one token each), so a newcomer's chunk finds the budget free;
- preemption: interactive work takes seats and KV blocks from the newest running batch
  sequence first; batch work preempts only batch work (itself, when no other runs);
- pace: while interactive sequences run, a step carries only as many batch decode
  rows and batch prompt tokens as keep it within BATCH_SLACK of its interactive cost
  (learned by the step budget; at least one row, taken in turns), so the interactive
  inter-token time barely moves while batch work uses what the step has to spare.
Within each class the tenants' fair order, KV shares and quotas are as before, and a
scheduler that never sees a batch sequence schedules exactly as it did without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from engine.scheduler.step_budget import MIN_PREFILL_TOKENS
from engine.sequence import Sequence

# How much longer batch work may make a step that carries interactive work: below the
# 10% the issue allows, because the estimates it is spent by are off on a CPU (a batch
# prompt chunk of a few tokens beside decode rows costs more a token than the large
# prompts the per-token cost is learned from), and rows and prompt tokens are each
# sized to the whole slack (bench/traffic_classes.py measured ITL x1.116 of alone at 0.1).
BATCH_SLACK = 0.08


@dataclass(frozen=True)
class InteractiveWaiting:
    """The interactive sequences in the waiting queue, as one step sees them."""

    count: int  # how many wait
    keys: AbstractSet[str]  # their tenants (fairness keys)


def interactive_waiting(waiting: Iterable[Sequence]) -> InteractiveWaiting:
    """How many waiting sequences are interactive, and their tenants: one walk of the
    queue serves both the step's admission rules and its prompt-token split."""
    count = 0
    keys: set[str] = set()
    for seq in waiting:
        if not seq.batch:
            count += 1
            keys.add(seq.fairness_key)
    return InteractiveWaiting(count, keys)


def newest_batch(running: Seq[Sequence]) -> Sequence | None:
    """The most recently admitted running batch sequence, if any."""
    return next((seq for seq in reversed(running) if seq.batch), None)


def same_class_or_below(running: list[Sequence], requester: Sequence) -> list[Sequence]:
    """The running sequences `requester` may preempt: any, for interactive work; only
    batch sequences (itself included) for batch work."""
    return [seq for seq in running if seq.batch] if requester.batch else running


@dataclass(frozen=True)
class BatchPace:
    """This step's allowance for batch work beside running interactive work."""

    rows: frozenset[str]  # the batch sequences whose decode rows run this step
    prompt_tokens: int  # batch prompt tokens the step may carry


def batch_pace(
    running: list[Sequence], turn: int, extra: tuple[int, int] | None
) -> BatchPace | None:
    """The allowance, or None when no interactive sequence runs (batch work is then
    free); `extra` is the step budget's estimate of what fits in the slack (None:
    not yet measured, then half as many rows as interactive ones and the step budget's
    least prompt chunk: a step with batch rows measures the next row count, and until
    then no batch prompt may double an interactive step), `turn` rotates which batch
    rows go."""
    interactive = sum(1 for seq in running if not seq.batch)
    batch = [seq for seq in running if seq.batch]
    if not interactive:
        return None
    rows, tokens = extra if extra is not None else (max(1, interactive // 2), MIN_PREFILL_TOKENS)
    rows = min(max(1, rows), len(batch))  # none while batch work only waits
    chosen = frozenset(batch[(turn + j) % len(batch)].seq_id for j in range(rows))
    return BatchPace(chosen, max(1, tokens))
