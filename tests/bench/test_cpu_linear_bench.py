"""bench/cpu_linear.py: bad arguments are refused before a model loads, and a tiny run
(two batch sizes, a few tokens) prints both sides and ends with one JSON line."""

from __future__ import annotations

import json

import pytest

from bench.cpu_linear import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batches", "two"], "--batches: 'two' is not a comma-separated list"),
        (["--batches", "1,,2"], "is not a comma-separated list"),
        (["--batches", "0"], "every batch must be between 1 and 256"),
        (["--batches", "1,999"], "every batch must be between 1 and 256"),
        (["--output-tokens", "1"], "--output-tokens: must be at least 2, not 1"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


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
