"""Overlap scheduling (the seed's §5.5): the host prepares step N+1 while step N runs.

    engine thread:  forward + sample N          | forward + sample N+1          | ...
    host thread:    take N-1's tokens, events;  | take N's tokens, events;      |
                    schedule + prepare N+1      | schedule + prepare N+2        |

The forward pass and sampling stay on the engine's own thread, as without overlap:
on the CPU torch's kernels run on that thread's OpenMP team, and a second thread
running kernels would start a second team, which libgomp then throttles
(engine/fronts/scratch_thread.py). The host thread does the Python work around the
step: stop checks, detokenizing and events for the step before, then scheduling,
block allocation and input building for the step after.

When step N is launched, each row that samples holds its token's place with
`PENDING_TOKEN`, so N+1 can be scheduled and its inputs built before N's tokens are
known; N+1's pending inputs are filled from N's result just before N+1's forward pass
(ModelRunner.run). Steps run in order on the engine thread, so a block freed while an
earlier step still writes it is only reused by a later step, and the scrubs that a
launch asks for run before its forward pass. A sequence that N ends (a stop token or
string, an abort) still has a row in N+1; that row's token is dropped.

A step runs in turn, after the one before has been taken, when a row needs the host to
know the previous token before it can be sampled (a grammar mask, a penalty, a logit
bias or a min_tokens suppression), when an adapter must be copied into a device slot,
or while the forward pass measures shorter than `overlap_min_forward_ms` (a tiny
model, or a fake one in a benchmark of what surrounds the engine: with nothing to hide
behind, each step's two hand-offs between the threads are pure cost). With speculative
decoding or KV tiers configured, every step does (the engine builds no
`OverlapStepper`). Greedy outputs are the same token for token either way, and so are
seeded ones.

A front that streams (engine.fronts.core_loop.EngineLoop) sets `deliver`: the host
thread then hands each step's events over as soon as it has taken them, while the next
forward pass runs. Returned with the next step instead, every token would reach its
client one whole step late.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.outputs import StreamEvent
from engine.runner.model_runner import PreparedStep, SampledToken
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class Launch:
    """A step scheduled and prepared, to run next."""

    output: SchedulerOutput
    step: PreparedStep
    sampling: frozenset[str]  # seq ids of the rows that sample
    scrub: list[int]  # blocks to zero before its forward pass
    prepare_s: float  # host time spent building its inputs


@dataclass(frozen=True)
class Ran:
    """A step that ran, whose tokens are not taken yet."""

    output: SchedulerOutput
    sampling: frozenset[str]
    sampled: dict[str, SampledToken]
    cost_s: float  # its host preparation and its run


@dataclass
class OverlapCounters:
    """Steps launched ahead, steps run in turn, and failed launches run again."""

    overlapped_steps: int = 0
    synchronous_steps: int = 0
    recovered_steps: int = 0


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
    """Runs the engine's steps with the host's work for the steps around each one done
    on a host thread while its forward pass runs."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._host = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine-host")
        self.ahead: Ran | None = None  # the step that ran last, its tokens not taken
        # What runs next: a prepared step, or a scheduled one that must run in turn.
        self._next: Launch | SchedulerOutput | None = None
        self._previous: dict[str, SampledToken] = {}  # the last run's tokens
        self.counters = OverlapCounters()
        self.min_forward_ms = engine.config.scheduler.overlap_min_forward_ms
        # Where the host thread hands a launched step's events as soon as it has them;
        # None: they are returned by the next `step` (the offline engine's loop).
        self.deliver: Callable[[list[StreamEvent]], None] | None = None
        ready = engine.scheduler.seq_ready
        # A sequence whose pending token is its last, whatever it is, sits the next step
        # out instead of computing a token that would be dropped.
        engine.scheduler.seq_ready = lambda seq: not self._ends_pending(seq) and ready(seq)

    def _ends_pending(self, seq: Sequence) -> bool:
        return seq.has_pending_token and (
            seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.engine.max_model_len
        )

    def step(self, started: float) -> list[StreamEvent]:
        """One step of the engine: runs the next step while the host takes the one before
        and prepares the one after."""
        events: list[StreamEvent] = []
        upcoming = self._next
        self._next = None
        if not isinstance(upcoming, Launch):
            # Nothing prepared (the first step, or one after a step in turn): take the
            # step before, schedule now, and run in turn or launch.
            events = self.drain()
            if upcoming is None or upcoming.is_empty:  # an empty one may be stale by now
                upcoming = self.engine.scheduler.schedule()
            output = _live(upcoming)
            if not output.is_empty:
                # A forward pass runs next: the step before's events go out now rather
                # than wait for it (with nothing to run they go out with this step).
                events = self._hand_over(events)
            if not self._can_launch(output):
                if not output.is_empty:
                    self.counters.synchronous_steps += 1
                return events + self.engine.run_scheduled(output, started)
            upcoming = self._launch(output)
        return events + self._run(upcoming)

    def drain(self) -> list[StreamEvent]:
        """Takes the tokens of the step that ran last, if they are not taken yet."""
        ran, self.ahead = self.ahead, None
        return [] if ran is None else self._take(ran)

    def close(self) -> None:
        """Stops the host thread (no host work is ever left running between steps)."""
        self._host.shutdown(wait=True)

    def _can_launch(self, output: SchedulerOutput) -> bool:
        # An adapter copied into a slot must wait for the step that may read its old one.
        return (
            not output.is_empty
            and self._forward_hides_host_work()
            and not self.engine.lora.slots.has_loads
            and all(overlappable(item) for item in output.scheduled)
        )

    def _forward_hides_host_work(self) -> bool:
        """False while the measured forward pass is shorter than the configured least:
        the host's work could then hide behind almost nothing, and the two hand-offs
        between threads each step would cost more than the overlap saves."""
        forward_s = self.engine.runner.forward_s
        return forward_s is None or forward_s * 1e3 >= self.min_forward_ms

    def _launch(self, output: SchedulerOutput) -> Launch:
        """Prepares a scheduled step to run."""
        engine = self.engine
        engine.mark_scheduled(output)
        began = time.perf_counter()
        step = engine.runner.prepare(output)
        scrub = engine.kv.take_blocks_to_scrub()
        sampling = frozenset(seq.seq_id for seq in step.seqs)
        return Launch(output, step, sampling, scrub, time.perf_counter() - began)

    def _run(self, launch: Launch) -> list[StreamEvent]:
        """Runs `launch` here while the host thread takes the step before and prepares
        the one after; returns the events of the step before."""
        engine = self.engine
        ran, self.ahead = self.ahead, None
        host = self._host.submit(self._host_work, ran, launch)
        began = time.perf_counter()
        try:
            engine.runner.scrub_blocks(launch.scrub)
            sampled = engine.runner.run(launch.step, self._previous)
            failure: Exception | None = None
        except Exception as exc:
            failure = exc
        run_s = time.perf_counter() - began
        events, upcoming = host.result()
        if failure is not None:
            if isinstance(upcoming, Launch):  # forgotten, but its freed blocks are scrubbed
                engine.runner.scrub_blocks(upcoming.scrub)
            return events + self._recover(launch)
        self.counters.overlapped_steps += 1
        self._previous = sampled
        self.ahead = Ran(launch.output, launch.sampling, sampled, launch.prepare_s + run_s)
        self._next = upcoming
        return events

    def _host_work(
        self, ran: Ran | None, launch: Launch
    ) -> tuple[list[StreamEvent], Launch | SchedulerOutput]:
        """On the host thread, while `launch` runs: takes `ran`'s tokens, counts
        `launch`'s rows as computed (pending tokens in place), schedules the step after
        and prepares it if it can be launched."""
        # The engine thread is inside the forward pass: nothing else reports now.
        events = [] if ran is None else self._hand_over(self._take(ran))
        for item in launch.output.scheduled:
            self.engine.scheduler.advance_one(item, item.seq.seq_id in launch.sampling)
        output = self.engine.scheduler.schedule()
        if not self._can_launch(output):
            return events, output
        return events, self._launch(output)

    def _hand_over(self, events: list[StreamEvent]) -> list[StreamEvent]:
        """Reports `events` at once where a front streams them (`deliver`), and returns
        what is left to return with the step: nothing then, else `events`. Called where
        no other report can happen: inside a step, on its thread or on the host thread."""
        if not events or self.deliver is None:
            return events
        self.deliver(events)
        return []

    def _take(self, ran: Ran) -> list[StreamEvent]:
        """Hands a run step's tokens to their sequences and requests."""
        engine = self.engine
        dropped = [
            item
            for item in ran.output.scheduled
            if item.seq.seq_id in ran.sampling
            and not item.seq.is_finished
            and not item.seq.has_pending_token
        ]
        events = engine.emit(ran.output, ran.sampled, settle=True)
        if dropped:  # preempted since launch: their tokens are drawn again when recomputed
            engine.runner.rewind(dropped)
        engine.observe_step(ran.output, ran.cost_s)
        return events

    def _recover(self, failed: Launch) -> list[StreamEvent]:
        """Undoes a failed step's advance (and forgets the step scheduled after it) and
        runs it again in turn, where a request that makes it fail fails alone
        (engine.fronts.step_isolation)."""
        self.counters.recovered_steps += 1
        self._previous = {}
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
