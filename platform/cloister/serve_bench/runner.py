"""A closed loop at one concurrency: warm up, then measure for a fixed duration.

Each worker thread is one simulated user sending its conversations' turns one after
another. Requests started during the warm-up are sent but not counted; requests
started in the measured window are counted whole, even when they end after it (the
loop then stops starting new ones and waits for them). The output throughput is
counted differently: every token that arrived inside the window, whichever request
it belongs to, over the window's length, so that neither the warm-up's requests
still running at its start nor the emptying loop after its end bias the rate (the
steady rate at the stated concurrency, which SGLang's count-based figure approaches
for long runs).
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
    window_tokens: float = 0.0  # output tokens of any request that arrived in the window

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
    everything: list[Timing] = []
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
            with lock:
                everything.append(timing)
                if timing.start >= window_start:
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
    tokens = sum(tokens_between(t, window_start, window_stop) for t in everything if t.ok)
    return RunResult(spec, counted, window_start, end, tokens)


def tokens_between(timing: Timing, start: float, stop: float) -> float:
    """The request's output tokens that arrived in [start, stop): its text chunks there,
    each weighing the request's tokens per chunk (a chunk may carry several)."""
    if not timing.chunk_times:
        return 0.0
    per_chunk = (timing.output_tokens or len(timing.chunk_times)) / len(timing.chunk_times)
    return per_chunk * sum(1 for c in timing.chunk_times if start <= c < stop)
