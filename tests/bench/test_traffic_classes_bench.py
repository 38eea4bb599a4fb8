"""bench/traffic_classes.py (bad arguments: test_bench_arguments.py): a tiny
run of its four phases prints them and ends with one JSON line."""

from __future__ import annotations

import json

import pytest

from bench.traffic_classes import main


@pytest.mark.slow
def test_a_tiny_run_reports_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    returned = main(
        ["--seconds", "1.5", "--batch-lines", "8", "--prompt-tokens", "16", "--new-tokens", "4"]
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report == json.loads(json.dumps(returned))
    phases = report["phases"]
    assert phases["interactive alone"]["batch_tok_s"] == 0
    assert phases["batch alone"]["interactive_tok_s"] == 0 < phases["batch alone"]["batch_tok_s"]
    assert phases["interactive alone"]["requests"] > 0
    assert set(report["goals_met"]) == {"interactive_within_10pct", "batch_60pct_of_left"}
    assert phases["interactive alone"]["itl_mean_ms"] > 0
    # The ceiling needs decode-only steps of two row counts, which a loaded machine's
    # 1.5 s phases may not give (null then); its arithmetic is tested below.
    ceiling = report["ceiling"]
    assert ceiling is None or (ceiling["ms_per_batch_token"] > 0 and ceiling["batch_tok_s"] > 0)


def test_a_phase_without_samples_has_no_ratio_and_misses_its_goal() -> None:
    """On a loaded machine a short phase may end before a second token: no ITL, so no
    ratio (null in the JSON), never a crash."""
    from bench.traffic_classes import _ratio

    assert _ratio(None, 10.0) is None and _ratio(12.0, None) is None
    assert _ratio(11.0, 10.0) == 1.1


def test_the_ceiling_prices_a_batch_token_at_a_row_and_its_share_of_the_prompt() -> None:
    import argparse
    from types import SimpleNamespace

    from bench.traffic_classes import Phase, _ceiling

    budget = SimpleNamespace(marginal_costs=lambda: (0.002, 0.001))  # 2 ms a row, 1 a token
    engine = SimpleNamespace(scheduler=SimpleNamespace(step_budget=budget))
    args = argparse.Namespace(prompt_tokens=64, new_tokens=32)
    flex = Phase("flex", interactive_tokens=700, seconds=10.0)  # 70 tok/s
    got = _ceiling(engine, args, {"batch_tok_s": 170.0}, flex)  # type: ignore[arg-type]
    # 2 ms + 64/32 * 1 ms = 4 ms a token; 0.1/1.1 of each second: 22.7 tok/s of 100 left.
    assert got == {"ms_per_batch_token": 4.0, "batch_tok_s": 22.7, "share_of_left": 0.227}
    budget.marginal_costs = lambda: None
    assert _ceiling(engine, args, {"batch_tok_s": 170.0}, flex) is None  # type: ignore[arg-type]
