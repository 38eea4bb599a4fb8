"""Overlap scheduling (the seed's §5.5): the host prepares step N+1 while step N runs.

    engine thread:   schedule N+1, prepare N+1, launch | take N's tokens, events | schedule N+2 ...
    forward worker:  ... forward + sample N ...        | forward + sample N+1 ...

When step N is launched, each row that samples holds its token's place with
`PENDING_TOKEN`, so N+1 can be scheduled, its blocks allocated and its inputs built at
once. The forward worker fills N+1's pending input tokens from N's result before
N+1's forward pass reads them (engine/runner/forward_worker.py). N's tokens are taken
(stop checks, detokenizing, events) while N+1 runs. A sequence that N ends still has a
row in N+1; that row's token is dropped, as an aborted sequence's is.

A step runs synchronously, after the one in flight has been taken, when a row needs
the host to know the previous token before it can be sampled (a grammar mask, a
penalty, a logit bias or a min_tokens suppression), or when an adapter must be copied
into a device slot that the step in flight may still read. With speculative decoding or
KV tiers configured, every step does (the engine builds no `OverlapStepper`).
Greedy outputs are the same token for token either way; so are seeded ones.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.outputs import StreamEvent
from engine.runner.forward_worker import ForwardWorker, StepResult
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class InFlight:
    """A launched step: what was scheduled, which sequences sample, its result to come."""

    output: SchedulerOutput
    sampling: frozenset[str]  # seq ids of the rows that sample
    future: concurrent.futures.Future[StepResult]
    prepare_s: float  # host time spent building its inputs


@dataclass
class OverlapCounters:
    """Steps launched ahead, steps run synchronously, and host time per kind."""

    overlapped_steps: int = 0
    synchronous_steps: int = 0
    recovered_steps: int = 0  # launched steps that failed and were run again synchronously


def overlappable(item: ScheduledSequence) -> bool:
    """True when a row can be sampled without the host knowing its previous token."""
    seq = item.seq
    params = seq.params
    return not (
        item.spec
        or params.structured is not None
        or params.logit_bias
        or params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
        or seq.num_output_tokens < params.min_tokens
    )


class OverlapStepper:
    """Runs the engine's steps with step N+1 prepared while step N's forward pass runs."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.worker = ForwardWorker(engine.runner)
        self.ahead: InFlight | None = None
        self.counters = OverlapCounters()
        ready = engine.scheduler.seq_ready
        # A sequence whose pending token is its last, whatever it is, sits the next step
        # out instead of computing a token that would be dropped.
        engine.scheduler.seq_ready = lambda seq: not self._ends_pending(seq) and ready(seq)

    def _ends_pending(self, seq: Sequence) -> bool:
        return seq.has_pending_token and (
            seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.engine.max_model_len
        )

    def step(self, started: float) -> list[StreamEvent]:
        """One step of the engine: launches the next step, then takes the one before."""
        engine = self.engine
        output = engine.scheduler.schedule()
        if (
            output.is_empty
            # An adapter copied into a slot while the step in flight may still read the
            # slot's old adapter: the copy waits for it.
            or engine.lora.slots.has_loads
            or not all(overlappable(item) for item in output.scheduled)
        ):
            return self._synchronous(output, started)
        engine.mark_scheduled(output)
        prepared_at = time.perf_counter()
        step = engine.runner.prepare(output)
        future = self.worker.submit(step, engine.kv.take_blocks_to_scrub())
        launched = InFlight(
            output,
            frozenset(seq.seq_id for seq in step.seqs),
            future,
            time.perf_counter() - prepared_at,
        )
        events, ok = self._take_ahead(launched)
        if not ok:  # the step before failed: `launched` was skipped, and is forgotten
            return events
        for item in output.scheduled:
            engine.scheduler.advance_one(item, item.seq.seq_id in launched.sampling)
        self.ahead = launched
        self.counters.overlapped_steps += 1
        return events

    def drain(self) -> list[StreamEvent]:
        """Takes the step in flight, if any (before a synchronous step or at close)."""
        events, _ = self._take_ahead(None)
        return events

    def close(self) -> None:
        """Waits for the step in flight and stops the forward worker."""
        self.worker.close()

    def _synchronous(self, output: SchedulerOutput, started: float) -> list[StreamEvent]:
        """Takes the step in flight, then runs `output` as the synchronous engine does
        (without the rows of sequences that the step in flight ended)."""
        events = self.drain()
        if not output.is_empty:
            self.counters.synchronous_steps += 1
        return events + self.engine.run_scheduled(_live(output), started)

    def _take_ahead(self, launched: InFlight | None) -> tuple[list[StreamEvent], bool]:
        """Takes the step in flight's tokens; False when it failed (it is then run again
        synchronously, and `launched`, queued behind it, was skipped)."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return [], True
        try:
            result = ahead.future.result()
        except Exception:
            if launched is not None:
                concurrent.futures.wait([launched.future])
            self.worker.reset()
            return self._recover(ahead), False
        engine = self.engine
        dropped = [
            item
            for item in ahead.output.scheduled
            if item.seq.seq_id in ahead.sampling
            and not item.seq.is_finished
            and not item.seq.has_pending_token
        ]
        events = engine.emit(ahead.output, result.sampled, settle=True)
        if dropped:  # preempted since launch: their tokens are drawn again when recomputed
            engine.runner.rewind(dropped)
        engine.observe_step(ahead.output, ahead.prepare_s + result.busy_s)
        return events, True

    def _recover(self, failed: InFlight) -> list[StreamEvent]:
        """Undoes a failed launched step's advance and runs it again synchronously, where
        a request that makes it fail fails alone (engine.fronts.step_isolation)."""
        self.counters.recovered_steps += 1
        for item in failed.output.scheduled:
            self.engine.scheduler.rewind_one(item)
        output = _live(failed.output)
        self.engine.runner.rewind(output.scheduled)
        return self.engine.run_scheduled(output, time.perf_counter(), {})


def _live(output: SchedulerOutput) -> SchedulerOutput:
    """`output` without the rows of sequences no longer running (ended or preempted)."""
    kept = tuple(i for i in output.scheduled if i.seq.status is SequenceStatus.RUNNING)
    if len(kept) == len(output.scheduled):
        return output
    return SchedulerOutput(kept, sum(i.num_new_tokens for i in kept), output.preempted)
