"""bench/model_families.py (bad arguments: test_bench_arguments.py): a
tiny run measures both sides for each family asked and ends with one JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.model_families import main
from server.settings import Settings


@pytest.mark.slow
def test_a_tiny_run_reports_both_sides_per_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "ratios.png"
    argv = ["--shape", "tiny", "--families", "qwen3,phi3", "--batches", "1,2"]
    returned = main([*argv, "--new-tokens", "4", "--threads", "1", "--plot", str(png)])
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert report == json.loads(json.dumps(returned))
    assert set(report["families"]) == {"qwen3", "phi3"}
    for rows in report["families"].values():
        assert set(rows) == {"1", "2"}
        for row in rows.values():
            assert row["ours_decode_tps"] > 0 and row["hf_decode_tps"] > 0
            assert row["ratio_decode"] == pytest.approx(
                row["ours_decode_tps"] / row["hf_decode_tps"], rel=0.01
            )
    assert report["goal"] == {"batch": 2, "ratio": 1.5}
    assert set(report["goal_met"]) == {"qwen3", "phi3"}
    assert png.stat().st_size > 1000
    # Our side runs as `cloister serve` does by default.
    assert report["cpu_packed_linears"] is Settings().engine.cpu_packed_linears
