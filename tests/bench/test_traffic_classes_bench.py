"""bench/traffic_classes.py (bad arguments: test_bench_arguments.py): a tiny
run of its four phases prints them and ends with one JSON line."""

from __future__ import annotations

import json

import pytest

from bench.traffic_classes import main


@pytest.mark.slow
def test_a_tiny_run_reports_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    returned = main(
        ["--seconds", "1.5", "--batch-lines", "8", "--prompt-tokens", "8", "--new-tokens", "4"]
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report == json.loads(json.dumps(returned))
    phases = report["phases"]
    assert phases["interactive alone"]["batch_tok_s"] == 0
    assert phases["batch alone"]["interactive_tok_s"] == 0 < phases["batch alone"]["batch_tok_s"]
    assert phases["interactive alone"]["requests"] > 0
    assert set(report["goals_met"]) == {"interactive_within_10pct", "batch_60pct_of_left"}


def test_a_phase_without_samples_has_no_ratio_and_misses_its_goal() -> None:
    """On a loaded machine a short phase may end before a second token: no ITL, so no
    ratio (null in the JSON), never a crash."""
    from bench.traffic_classes import _ratio

    assert _ratio(None, 10.0) is None and _ratio(12.0, None) is None
    assert _ratio(11.0, 10.0) == 1.1
