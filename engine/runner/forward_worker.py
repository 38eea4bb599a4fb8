"""The thread that runs launched steps, one after another, for overlap scheduling.

Steps run in the order they are submitted, so a step's pending input tokens (what the
step before it samples) are that step's results by the time it starts, and K/V writes
keep the order the engine scheduled them in: a block freed on the engine's thread
while an earlier step still writes it is reused only by a later step. The scrubs a
step's launch asked for run on this thread too, just before its forward pass, after
every earlier step's writes.

Once a step raises, the steps queued behind it are skipped (`StepSkipped`): their
pending tokens have no value. The engine then runs the failed step again on its own
thread, with fault isolation (engine.fronts.step_isolation), and calls `reset`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass

from engine.runner.model_runner import ModelRunner, PreparedStep, SampledToken


class StepSkipped(Exception):
    """A step not run because a step launched before it failed."""


@dataclass(frozen=True)
class StepResult:
    """A launched step's tokens and how long the worker spent on it."""

    sampled: dict[str, SampledToken]
    busy_s: float  # scrub, pending tokens, forward pass and sampling


class ForwardWorker:
    """One thread that scrubs, fills pending tokens, runs the forward pass and samples."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="forward")
        # Touched on the worker's thread only, but for `reset` (called when it is idle).
        self._previous: dict[str, SampledToken] = {}
        self._failed = False
        self._lock = threading.Lock()

    def submit(self, step: PreparedStep, scrub: list[int]) -> concurrent.futures.Future[StepResult]:
        """Queues a step (and the scrubs due before it); its future holds its result."""
        return self._pool.submit(self._run, step, scrub)

    def reset(self) -> None:
        """Runs steps again after a failure; the engine's thread calls it once every
        launched step has ended."""
        with self._lock:
            self._failed = False
            self._previous = {}

    def close(self) -> None:
        """Waits for the queued steps, then stops the thread."""
        self._pool.shutdown(wait=True)

    def _run(self, step: PreparedStep, scrub: list[int]) -> StepResult:
        started = time.perf_counter()
        with self._lock:
            # Scrubs are never skipped: a freed block must not keep a domain's K/V.
            self.runner.scrub_blocks(scrub)
            if self._failed:
                raise StepSkipped("a step launched before this one failed")
            try:
                sampled = self.runner.run(step, self._previous)
            except BaseException:
                self._failed = True
                raise
            self._previous = sampled
        return StepResult(sampled, time.perf_counter() - started)
