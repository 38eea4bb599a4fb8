"""What making usage durable before the response costs: `persist` latency with and without fsync.

    python bench/usage_durability.py [--records 4000] [--concurrency 32] [--think-ms 2]

A completed request awaits `MeteringSink.persist` before its last byte is sent: the
row is appended to the spool by the journal thread, one write and one fsync per
group of concurrent rows (group commit). This runs `--concurrency` simulated
requests on one event loop (each "works" `--think-ms`, then persists its usage),
once with the fsync and once without it, in the same run, on the same disk and
database (SQLite in a temporary folder, or --database-url), and reports the
latency each adds at p50/p99, the p99 ratio and the mean group size. Last line JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "platform"),
]

from admin.metering import MeteringSink  # noqa: E402
from bench.metering import sample_record  # noqa: E402
from tenancy.db import make_engine, make_session_factory, upgrade_database  # noqa: E402


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[int(q * (len(sorted_values) - 1))]


async def _load(
    sink: MeteringSink, run: str, records: int, concurrency: int, think_s: float
) -> list[float]:
    latencies: list[float] = []
    next_id = iter(range(records))

    async def client() -> None:
        for i in next_id:
            await asyncio.sleep(think_s)  # the request's own work
            start = time.perf_counter()
            await sink.persist(sample_record(i, run))
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


def run_once(url: str, spool: Path, *, fsync: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One load run against a fresh sink; latency figures in microseconds."""
    sessions = make_session_factory(make_engine(url))
    sink = MeteringSink(sessions, spool, fsync=fsync).start()
    appends = _count_appends(sink)
    try:
        run = "fsync" if fsync else "nofsync"
        t0 = time.perf_counter()
        lat = asyncio.run(_load(sink, run, args.records, args.concurrency, args.think_ms / 1e3))
        elapsed = time.perf_counter() - t0
    finally:
        sink.close(timeout_s=600)
    lat.sort()
    return {
        "p50_us": round(statistics.median(lat) * 1e6, 1),
        "p99_us": round(_quantile(lat, 0.99) * 1e6, 1),
        "max_us": round(lat[-1] * 1e6, 1),
        "records_per_s": round(len(lat) / elapsed, 1),
        "mean_group": round(len(lat) / max(1, appends[0]), 2),
    }


def _count_appends(sink: MeteringSink) -> list[int]:
    """Counts the spool's appends (one per group commit) by wrapping its method."""
    count = [0]
    append = sink.spool.append

    def counted(rows: Any) -> None:
        count[0] += 1
        append(rows)

    sink.spool.append = counted  # type: ignore[method-assign]
    return count


def main() -> None:
    """Runs both variants and prints a JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--think-ms", type=float, default=2.0)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="usage-durability-"))
    url = args.database_url or f"sqlite:///{folder / 'bench.db'}"
    upgrade_database(url)
    # Interleaved, so that both variants see the same disk and database state.
    results: dict[str, list[dict[str, Any]]] = {"fsync": [], "no_fsync": []}
    for round_ in range(2):
        for name, fsync in (("no_fsync", False), ("fsync", True)):
            spool = folder / f"spool-{name}-{round_}.jsonl"
            results[name].append(run_once(url, spool, fsync=fsync, args=args))
    best = {name: min(runs, key=lambda r: r["p99_us"]) for name, runs in results.items()}
    for name, r in best.items():
        print(
            f"{name:9s} p50 {r['p50_us']:8.1f} us  p99 {r['p99_us']:8.1f} us  "
            f"{r['records_per_s']:8.1f} rec/s  group {r['mean_group']}"
        )
    ratio = best["fsync"]["p99_us"] / max(best["no_fsync"]["p99_us"], 1e-9)
    print(f"p99 with fsync / without: {ratio:.2f}x")
    summary = {
        "records": args.records,
        "concurrency": args.concurrency,
        "think_ms": args.think_ms,
        "fsync": best["fsync"],
        "no_fsync": best["no_fsync"],
        "p99_ratio": round(ratio, 2),
        "p99_added_by_fsync_us": round(best["fsync"]["p99_us"] - best["no_fsync"]["p99_us"], 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
