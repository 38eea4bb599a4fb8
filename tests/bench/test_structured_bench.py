"""bench/structured.py: a quick run on the tiny model decodes the same number of tokens
in both modes, reports the overhead figures, and times both grammar compilers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.structured import main
from tests.utils.bench_runs import run_bench_main
from tests.utils.tiny_model import make_tiny_model_dir


@pytest.mark.slow
def test_a_quick_run_reports_both_modes_and_both_compilers(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path)
    report, lines = run_bench_main(
        main, ["--quick", "--model", str(model)], tmp_path / "stdout.txt"
    )
    assert report["free"]["tokens"] == report["structured"]["tokens"] == 4 * 8
    for mode in ("free", "structured"):
        assert report[mode]["itl_p50_ms"] > 0 and report[mode]["throughput_tok_s"] > 0
    assert report["itl_p50_overhead"] == pytest.approx(
        report["structured"]["itl_p50_ms"] / report["free"]["itl_p50_ms"] - 1, abs=1e-3
    )
    assert report["mask_fill_ms_per_step"] > 0
    assert set(report["compile"]["schemas"]) == {"user", "nested_defs"}
    for row in report["compile"]["schemas"].values():
        assert row["llguidance_ms"] > 0 and row["outlines_core_ms"] > 0
    assert any(line.startswith("structured/free: ITL p50") for line in lines)
