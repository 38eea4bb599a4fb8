"""`cloister bench kernels --smoke` runs bench/gpu_decode.py end to end on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cloister.commands.bench import BENCH_SCRIPT, commands


def test_bench_kernels_smoke_writes_parity_and_engine_figures(tmp_path: Path) -> None:
    assert BENCH_SCRIPT.is_file()
    (group,) = commands
    out = tmp_path / "figures.json"
    result = CliRunner().invoke(
        group,
        [
            "kernels",
            "--smoke",
            "--parts",
            "parity,engine",
            "--engine-budget-s",
            "60",
            "--json-out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["smoke"] is True
    assert figures["parity"]["passed"] is True
    assert len(figures["parity"]["prompts"]) == 8
    (engine,) = figures["engine"]
    batches = sorted((row["context"], row["batch"]) for row in engine["decode"])
    assert batches == [(64, 1), (64, 2), (64, 4), (128, 1), (128, 3)]
    assert all(row["tokens_per_s"] > 0 and row["bytes_per_step"] > 0 for row in engine["decode"])
    assert engine["prefill"]["tokens"] == 64
    assert "kernels" not in figures and "decode" not in figures
