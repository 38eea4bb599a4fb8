"""bench/engine_hop.py: a quick run times every request on both sides, through a real
`cloister engine serve` code path, and prints its figures as the last line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.engine_hop import Timing, added, main, pct, summary
from tests.utils.bench_runs import run_bench_main


def test_percentiles_and_the_added_figures_are_remote_minus_in_process() -> None:
    assert pct([3.0, 1.0, 2.0], 50) == 2.0
    assert pct([1.0, 2.0, 3.0, 4.0, 5.0], 95) == 5.0
    local = summary([Timing(0.001, 0.008, 8)] * 3)
    remote = summary([Timing(0.0015, 0.0095, 8)] * 3)
    assert local["per_token_p50_ms"] == pytest.approx(1.0)
    hop = added(local, remote)
    assert hop["ttft_p50_ms"] == pytest.approx(0.5)
    assert hop["e2e_p50_ms"] == pytest.approx(1.5)
    assert Timing(0.001, 0.002, 1).per_token_s is None


@pytest.mark.slow
def test_a_quick_run_reports_every_side(tmp_path: Path) -> None:
    argv = ["--requests", "4", "--warmup", "1", "--round", "2", "--concurrency", "2"]
    report, lines = run_bench_main(main, argv, tmp_path / "stdout.txt")
    assert report["requests_per_side"] == 4
    assert report["tokens_per_request"] == 8  # EOS ignored: every request makes max_tokens
    assert report["concurrency"] == 2
    assert all(report["output_tokens_per_s"][side] > 0 for side in ("in_process", "remote"))
    for side in ("in_process", "remote", "remote_http"):
        figures = report[side]
        assert 0 < figures["ttft_p50_ms"] <= figures["e2e_p50_ms"]
        assert figures["per_token_p50_ms"] > 0
    assert report["added"]["e2e_p50_ms"] == pytest.approx(
        report["remote"]["e2e_p50_ms"] - report["in_process"]["e2e_p50_ms"], abs=1e-3
    )
    assert report["added_http"]["ttft_p50_ms"] == pytest.approx(
        report["remote_http"]["ttft_p50_ms"] - report["in_process"]["ttft_p50_ms"], abs=1e-3
    )
    cpu = report["cpu_per_request_ms"]
    # Client and server: a remote side uses more CPU than this process alone did in-process
    # (the server process did the engine's work).
    assert cpu["remote"] > 0 and cpu["remote_http"] > 0
    assert isinstance(report["meets_goal"], bool)
    # The machine's floor was measured in the same run: a real round trip takes time.
    assert 0 < report["loopback_rtt_p50_ms"] <= report["loopback_rtt_p95_ms"]


@pytest.mark.parametrize("bad", ["0", "-3", "two"])
def test_a_concurrency_below_one_or_not_a_number_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--concurrency", bad])
    assert exit_info.value.code == 2  # argparse's usage error, before anything starts
