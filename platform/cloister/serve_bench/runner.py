"""A closed loop at one concurrency: warm up, then measure for a fixed duration.

Each worker thread is one simulated user sending its conversations' turns one after
another. Requests started during the warm-up are sent but not counted; requests
started in the measured window are counted whole, even when they end after it (the
loop then stops starting new ones and waits for them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cloister.serve_bench.client import CompletionClient, Timing
from cloister.serve_bench.workload import Conversations, WorkloadCell, tenant_prefixes


@dataclass(frozen=True)
class RunSpec:
    """One run: a workload cell at one concurrency."""

    cell: WorkloadCell
    concurrency: int
    warmup_s: float
    duration_s: float
    tenants: int
    vocab: int
    seed: int


@dataclass(frozen=True)
class RunResult:
    """The counted requests of a run and the window they were measured over."""

    spec: RunSpec
    timings: list[Timing]
    window_start: float
    window_end: float  # when the last counted request ended

    @property
    def elapsed_s(self) -> float:
        """Seconds from the window's start to the last counted request's end."""
        return max(1e-9, self.window_end - self.window_start)


def run_closed_loop(
    client: CompletionClient, spec: RunSpec, tick: Callable[[float], None] | None = None
) -> RunResult:
    """Runs `spec`; `tick(seconds)` is called as time passes (for a progress bar)."""
    prefixes = tenant_prefixes(spec.cell, spec.tenants, spec.vocab, spec.seed)
    counted: list[Timing] = []
    lock = threading.Lock()
    began = time.perf_counter()
    window_start = began + spec.warmup_s
    window_stop = window_start + spec.duration_s

    def worker(index: int) -> None:
        users = Conversations(
            spec.cell,
            prefixes,
            vocab=spec.vocab,
            seed=spec.seed,
            worker=index,
            workers=spec.concurrency,
        )
        while time.perf_counter() < window_stop:
            planned = users.next()
            timing = client.send(planned.tenant, planned.prompt, planned.max_tokens)
            if timing.start >= window_start:
                with lock:
                    counted.append(timing)

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True) for i in range(spec.concurrency)
    ]
    for thread in threads:
        thread.start()
    last = began
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        now = time.perf_counter()
        if tick is not None:
            tick(min(now, window_stop) - min(last, window_stop))
        last = now
    for thread in threads:
        thread.join()
    end = max((t.end for t in counted), default=window_stop)
    return RunResult(spec, counted, window_start, end)
