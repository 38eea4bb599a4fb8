"""bench/cpu_linear.py (bad arguments: test_bench_arguments.py): a tiny run (two batch
sizes, a few tokens) prints both sides and ends with one JSON line."""

from __future__ import annotations

import json

import pytest

from bench.cpu_linear import main


@pytest.mark.slow
def test_a_tiny_run_reports_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    returned = main(["--batches", "1,3", "--output-tokens", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert report == json.loads(json.dumps(returned))
    assert set(report["ms_per_decode_step"]) == {"torch", "packed"}
    for side in report["ms_per_decode_step"].values():
        assert set(side) == {"1", "3"} and all(ms > 0 for ms in side.values())
    assert set(report["speedup_vs_torch"]) == {"1", "3"}
    assert any(line.split()[:1] == ["3"] for line in lines[:-1])  # the table's row
