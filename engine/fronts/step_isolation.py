"""Runs one step so that a request that makes it fail fails alone.

The principle: a step's failure is never blamed on a request that does not fail
when it is run without the others. The step is one batch of independent rows
(attention, sampling and penalties all work row by row), so any subset of it
computes exactly what the whole would have for those rows. When the whole batch
raises, whatever the cause (a bad parameter nobody thought of, a kernel bug on
one shape, a transient device error), the batch is split by request and each
half is run again, recursively:

    [a b c d] raises -> [a b] ok, [c d] raises -> [c] ok, [d] raises -> d fails

Only a request that raises when it is run alone is failed; every other one gets
the token it would have got. A fault that needs the whole batch to show (memory
pressure, a transient error) fails nobody. Cost: nothing while steps succeed;
about 2 log2(B) extra runs per culprit when one fails.

Re-running is safe because a run changes nothing the retry depends on: KV writes
go to the same slots with the same values, block-table syncs are idempotent,
penalty counts only follow the sequences' own histories (unchanged until the
step is post-processed), and the random state of every sampled row is rewound
before each retry (`ModelRunner.rewind`).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.runner.model_runner import SampledToken
from engine.scheduler.output import ScheduledSequence, SchedulerOutput

Execute = Callable[[SchedulerOutput], dict[str, SampledToken]]
Rewind = Callable[[tuple[ScheduledSequence, ...]], None]


def execute_isolated(
    execute: Execute, rewind: Rewind, output: SchedulerOutput
) -> tuple[dict[str, SampledToken], dict[str, Exception]]:
    """Runs `output`; returns the tokens sampled and, per failed request id, its error.

    A request is in the second map only if it raised when run alone; its rows are
    then missing from the first.
    """
    try:
        return execute(output), {}
    except Exception as exc:
        first = exc
    groups: dict[str, list[ScheduledSequence]] = {}
    for item in output.scheduled:
        # The samples of one request (n > 1) stand or fall together.
        groups.setdefault(item.seq.request_id, []).append(item)
    sampled: dict[str, SampledToken] = {}
    failed: dict[str, Exception] = {}
    _split(list(groups.values()), first, execute, rewind, sampled, failed)
    return sampled, failed


def _split(
    groups: list[list[ScheduledSequence]],
    error: Exception,
    execute: Execute,
    rewind: Rewind,
    sampled: dict[str, SampledToken],
    failed: dict[str, Exception],
) -> None:
    """`groups` raised `error` together: run each half alone, recursing into failures."""
    if len(groups) == 1:
        failed[groups[0][0].seq.request_id] = error
        return
    middle = len(groups) // 2
    for half in (groups[:middle], groups[middle:]):
        items = tuple(item for group in half for item in group)
        rewind(items)
        try:
            # `preempted` goes with the first try only: its rows were released then.
            sampled.update(execute(SchedulerOutput(items, sum(i.num_new_tokens for i in items))))
        except Exception as exc:
            _split(half, exc, execute, rewind, sampled, failed)
