"""From timed requests to the figures a serving comparison reports, and the frontier plot.

Percentiles are over requests (TTFT, TPOT, end-to-end latency) or over every token
gap of every request (ITL), as SGLang's bench_serving computes them. Goodput is the
rate of requests that met the SLO: TTFT and TPOT both within their bounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloister.serve_bench.runner import RunResult


@dataclass(frozen=True)
class Slo:
    """The latency contract a request must meet to count towards goodput (milliseconds)."""

    ttft_ms: float
    tpot_ms: float


def percentiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """mean, p50, p95 and p99 of `values` (seconds) times `scale` (ms by default)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def at(q: float) -> float:
        # Linear interpolation between closest ranks, as numpy's default percentile.
        pos = q * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return {
        "mean": statistics.fmean(ordered) * scale,
        "p50": at(0.50) * scale,
        "p95": at(0.95) * scale,
        "p99": at(0.99) * scale,
    }


def summarize(result: RunResult, slo: Slo | None) -> dict[str, Any]:
    """The figures of one run, JSON-ready."""
    ok = [t for t in result.timings if t.ok]
    failed = [t for t in result.timings if not t.ok]
    elapsed = result.elapsed_s
    prompt_tokens = sum(t.prompt_tokens for t in ok)
    tpots = [t.tpot for t in ok if t.tpot is not None]
    figures: dict[str, Any] = {
        "workload": result.spec.cell.name,
        "input_len": result.spec.cell.input_len,
        "output_len": result.spec.cell.output_len,
        "prefix_share": result.spec.cell.prefix_share,
        "turns": result.spec.cell.turns,
        "tenants": result.spec.tenants,
        "concurrency": result.spec.concurrency,
        "warmup_s": result.spec.warmup_s,
        "duration_s": elapsed,
        "completed": len(ok),
        "failed": len(failed),
        "first_error": failed[0].error if failed else "",
        "request_throughput": len(ok) / elapsed,
        "input_throughput": prompt_tokens / elapsed,
        # Tokens that arrived in the window over its length (see runner); the counted
        # requests' own tokens over their span beside it.
        "output_throughput": result.window_tokens / max(1e-9, result.spec.duration_s),
        "counted_output_throughput": sum(t.output_tokens for t in ok) / elapsed,
        "cached_token_fraction": (
            sum(t.cached_tokens for t in ok) / prompt_tokens if prompt_tokens else 0.0
        ),
        "ttft_ms": percentiles([t.ttft for t in ok]),
        "itl_ms": percentiles([gap for t in ok for gap in t.itl]),
        "tpot_ms": percentiles([x for x in tpots]),
        "e2e_latency_ms": percentiles([t.latency for t in ok]),
    }
    if slo is not None:
        good = [
            t
            for t in ok
            if t.ttft * 1000 <= slo.ttft_ms and (t.tpot is None or t.tpot * 1000 <= slo.tpot_ms)
        ]
        figures["slo"] = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms}
        figures["goodput"] = len(good) / elapsed
        figures["slo_attainment"] = len(good) / len(ok) if ok else 0.0
    return figures


def plot_frontier(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """Output throughput against p95 TTFT and p95 ITL, one line per workload (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_itl) = plt.subplots(1, 2, figsize=(11, 4.5))
    for workload in dict.fromkeys(r["workload"] for r in runs):
        points = sorted(
            (r for r in runs if r["workload"] == workload), key=lambda r: r["concurrency"]
        )
        x = [r["output_throughput"] for r in points]
        for ax, key in ((ax_ttft, "ttft_ms"), (ax_itl, "itl_ms")):
            y = [r[key]["p95"] for r in points]
            ax.plot(x, y, marker="o", label=workload)
            for r, xi, yi in zip(points, x, y, strict=True):
                ax.annotate(
                    f"c{r['concurrency']}",
                    (xi, yi),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                )
    ax_ttft.set(xlabel="output tokens/s", ylabel="p95 TTFT (ms)", title="Throughput vs TTFT")
    ax_itl.set(xlabel="output tokens/s", ylabel="p95 ITL (ms)", title="Throughput vs ITL")
    for ax in (ax_ttft, ax_itl):
        ax.grid(True, alpha=0.3)
    ax_itl.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
