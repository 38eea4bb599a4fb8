"""Time series for the console's overview: usage records bucketed per step, plus engine samples.

Usage records give requests/s, tokens/s, p95 TTFT and p95 inter-token latency
(each request's mean gap: (latency - ttft) / (completion_tokens - 1)). Engine and
gateway counters (KV usage, prefix-cache queries and hits, limiter rejections)
are not stored in the database, so a `StatsSampler` keeps the last hour of
snapshots of an optional callable in memory.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from admin.models import UsageRow

# Cumulative counters a stats callable may report; anything else is read as a gauge.
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "rate_limit_rejections")
MAX_ROWS = 200_000  # the overview reads at most this many raw records (newest first)

EngineStats = Callable[[], Mapping[str, float]]


@dataclass(frozen=True)
class Sample:
    """One snapshot of the stats callable at unix time `at`."""

    at: float
    values: Mapping[str, float]


class StatsSampler:
    """Keeps `window_s` of snapshots of `source`; thread-safe; optional background thread."""

    def __init__(
        self,
        source: EngineStats,
        *,
        window_s: float = 3600.0,
        min_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._window = window_s
        self._min_interval = min_interval_s
        self._clock = clock
        self._samples: deque[Sample] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, *, force: bool = False) -> None:
        """Takes a snapshot unless one is younger than `min_interval_s`; drops old ones."""
        now = self._clock()
        with self._lock:
            if not force and self._samples and now - self._samples[-1].at < self._min_interval:
                return
        # The callable may take locks of its own: call it outside ours.
        values = {k: float(v) for k, v in self._source().items()}
        with self._lock:
            self._samples.append(Sample(now, values))
            while self._samples and self._samples[0].at < now - self._window:
                self._samples.popleft()

    def samples(self) -> list[Sample]:
        """The kept snapshots, oldest first."""
        with self._lock:
            return list(self._samples)

    def start(self, every_s: float) -> StatsSampler:
        """Samples every `every_s` seconds on a daemon thread until `stop`."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, args=(every_s,), name="console-stats", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the background thread (if any) and waits for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.sample(force=True)
            except Exception:  # an engine hiccup must not end sampling for good
                continue


def p95(values: Sequence[float]) -> float | None:
    """The nearest-rank 95th percentile, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _usage_rows(
    session: Session, start: dt.datetime, tenant_id: str | None
) -> tuple[list[UsageRow], bool]:
    query = select(UsageRow).where(UsageRow.occurred_at >= start)
    if tenant_id is not None:
        query = query.where(UsageRow.tenant_id == tenant_id)
    rows = list(session.scalars(query.order_by(UsageRow.occurred_at.desc()).limit(MAX_ROWS + 1)))
    return rows[:MAX_ROWS], len(rows) > MAX_ROWS


def _bucket(at: float, start: float, step: float, n: int) -> int | None:
    i = int((at - start) // step)
    return i if 0 <= i < n else None


def overview(
    session: Session,
    *,
    now: dt.datetime,
    minutes: int,
    step_s: int,
    samples: Sequence[Sample] | None,
    tenant_id: str | None = None,
) -> dict[str, object]:
    """Series over the last `minutes`, one point per `step_s` seconds (None: no data)."""
    n = max(1, (minutes * 60) // step_s)
    end_ts = math.ceil(now.timestamp() / step_s) * step_s
    start_ts = end_ts - n * step_s
    start = dt.datetime.fromtimestamp(start_ts, dt.UTC)
    rows, truncated = _usage_rows(session, start, tenant_id)

    requests = [0] * n
    tokens = [0] * n
    prompt = [0] * n
    cached = [0] * n
    rejected = [0] * n
    ttfts: list[list[float]] = [[] for _ in range(n)]
    itls: list[list[float]] = [[] for _ in range(n)]
    errors = 0
    for r in rows:
        i = _bucket(r.occurred_at.timestamp(), start_ts, step_s, n)
        if i is None:
            continue
        errors += r.status >= 400
        if r.status == 429:
            rejected[i] += 1
            continue
        requests[i] += 1
        tokens[i] += r.prompt_tokens + r.completion_tokens
        prompt[i] += r.prompt_tokens
        cached[i] += r.cached_tokens
        if r.ttft_s is not None:
            ttfts[i].append(r.ttft_s)
            if r.completion_tokens > 1:
                itls[i].append(max(0.0, r.latency_s - r.ttft_s) / (r.completion_tokens - 1))

    series: dict[str, list[float | None]] = {
        "requests_per_s": [c / step_s for c in requests],
        "tokens_per_s": [c / step_s for c in tokens],
        "prefix_cache_hit_rate": [
            c / p if p else None for c, p in zip(cached, prompt, strict=True)
        ],
        "ttft_p95_s": [p95(v) for v in ttfts],
        "itl_p95_s": [p95(v) for v in itls],
        "kv_cache_usage": [None] * n,
        "rate_limit_rejections": [float(c) for c in rejected],
    }
    if samples:
        _fold_samples(series, samples, start_ts, step_s, n)
    labels = [
        dt.datetime.fromtimestamp(start_ts + (i + 1) * step_s, dt.UTC).isoformat() for i in range(n)
    ]
    served, total_prompt = sum(requests), sum(prompt)
    window = {
        "requests": served + sum(rejected),
        "tokens": sum(tokens),
        "errors": errors,
        "error_rate": errors / (served + sum(rejected)) if served + sum(rejected) else None,
        "prefix_cache_hit_rate": sum(cached) / total_prompt if total_prompt else None,
    }
    return {
        "start": start.isoformat(),
        "window": window,
        "step_s": step_s,
        "labels": labels,
        "series": series,
        "engine_stats": bool(samples),
        "truncated": truncated,
    }


def _fold_samples(
    series: dict[str, list[float | None]],
    samples: Sequence[Sample],
    start_ts: float,
    step_s: int,
    n: int,
) -> None:
    """Engine gauges (mean per step); counter deltas replace usage-derived values where sampled."""
    gauge_sum = [0.0] * n
    gauge_n = [0] * n
    deltas = {c: [0.0] * n for c in COUNTERS}
    seen = {c: [False] * n for c in COUNTERS}
    prev: Sample | None = None
    for s in samples:
        i = _bucket(s.at, start_ts, step_s, n)
        if i is not None and "kv_cache_usage" in s.values:
            gauge_sum[i] += s.values["kv_cache_usage"]
            gauge_n[i] += 1
        if i is not None and prev is not None:
            for c in COUNTERS:
                if c in s.values and c in prev.values:
                    now_v, before = s.values[c], prev.values[c]
                    # A smaller value means a restart: count from its zero.
                    deltas[c][i] += now_v - before if now_v >= before else now_v
                    seen[c][i] = True
        prev = s
    series["kv_cache_usage"] = [gauge_sum[i] / gauge_n[i] if gauge_n[i] else None for i in range(n)]
    if any(seen["prefix_cache_queries"]):
        q, h = deltas["prefix_cache_queries"], deltas["prefix_cache_hits"]
        old = series["prefix_cache_hit_rate"]
        series["prefix_cache_hit_rate"] = [
            (h[i] / q[i] if q[i] else None) if seen["prefix_cache_queries"][i] else old[i]
            for i in range(n)
        ]
    if any(seen["rate_limit_rejections"]):
        r = deltas["rate_limit_rejections"]
        old = series["rate_limit_rejections"]
        series["rate_limit_rejections"] = [
            r[i] if seen["rate_limit_rejections"][i] else old[i] for i in range(n)
        ]
