"""bench/multi_lora.py: a quick run on the tiny model prints every figure and a JSON last line."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from bench.multi_lora import main, percentile

QUICK = [
    "--tiny",
    "--requests",
    "4",
    "--prompt-len",
    "8",
    "--tokens",
    "3",
    "--rounds",
    "1",
    "--ttft-adapters",
    "4",
    "--ttft-slots",
    "2",
    "--ttft-requests",
    "8",
]


def test_a_quick_run_reports_every_figure_and_the_goals() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        returned = main(QUICK)
    lines = out.getvalue().strip().splitlines()
    summary: dict[str, Any] = json.loads(lines[-1])
    assert summary == json.loads(json.dumps(returned))
    assert set(summary["throughput_tok_s"]) == {"base", "1", "4", "16"}
    assert all(rate > 0 for rate in summary["throughput_tok_s"].values())
    ratio16 = summary["throughput_tok_s"]["16"] / summary["throughput_tok_s"]["base"]
    assert summary["goal_16_adapters_within_30pct"] == (ratio16 >= 0.70)
    ttft = summary["ttft"]
    assert ttft["adapters"] == 4 and ttft["slots_over"] == 2 and ttft["requests"] == 8
    for side in ("over_slots", "in_slots"):
        assert 0 < ttft[f"{side}_p50_ms"] <= ttft[f"{side}_p95_ms"]
    assert summary["goal_ttft_p50_within_3x"] == (ttft["p50_ratio"] <= 3.0)
    assert any(line.startswith("ttft p50 over/in slots") for line in lines)


def test_percentile_interpolates() -> None:
    values = [float(v) for v in range(1, 102)]  # 1..101
    assert percentile(values, 0.50) == 51.0
    assert percentile(values, 0.95) == 96.0
