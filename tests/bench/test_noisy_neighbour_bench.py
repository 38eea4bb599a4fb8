"""bench/noisy_neighbour.py (bad arguments: test_bench_arguments.py): a tiny
run (the tiny random model, two victim requests a scenario) ends with one JSON line
that holds every side's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.noisy_neighbour import main
from tests.reliability.noisy import ATTACKS, SCENARIOS
from tests.utils.bench_runs import run_bench_main
from tests.utils.tiny_model import make_tiny_model_dir

# The tiny model's KV per token in fp32: 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes.
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 16 * 2 * 4


@pytest.mark.slow
def test_a_tiny_run_reports_both_sides(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path, tie=False)
    argv = ["--model", str(model), "--model-name", "tiny", "--no-progress", "--requests", "2"]
    argv += ["--kv-bytes-per-token", str(TINY_KV_BYTES_PER_TOKEN), "--pool-blocks", "32"]
    argv += ["--attack-prompt-tokens", "64", "--flood-prompt-tokens", "128", "--idle-cap-s", "3"]
    argv += ["--logs", str(tmp_path / "logs")]
    report, lines = run_bench_main(main, argv, tmp_path / "stdout.txt")
    assert report["plan"]["pool_tokens"] == 32 * 16
    assert set(report["sides"]) == {"before", "after"}
    for side in report["sides"].values():
        assert set(side["scenarios"]) == set(SCENARIOS)
        for name, figures in side["scenarios"].items():
            # The fair case runs again after the attacks, joined to the first run.
            assert figures["requests"] == (4 if name == "fair" else 2), name
            for key in ("ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms"):
                assert figures[key] is not None and figures[key] > 0, figures
        for attack in ATTACKS:
            assert set(side["vs_fair"][attack]) == {"ttft_p50", "itl_p50", "e2e_p50"}
            assert set(side["vs_alone"][attack]) == {"ttft_p50", "itl_p50", "e2e_p50"}
            assert "no_victim_preemption" in side["goals"][attack]
        assert isinstance(side["meets_goals"], bool)
        assert side["attacker_problems"] == []
    assert "cached_after_flood" in report["sides"]["after"]["scenarios"]["flood"]
    assert report["sides"]["before"]["settings"]["CLOISTER_KV_SHARES"] == "false"
    assert report["sides"]["after"]["settings"] == "defaults"
    assert (tmp_path / "logs" / "before.log").is_file()
    # The table came before the JSON: one row a side and scenario.
    assert sum(line.startswith(("before ", "after ")) for line in lines) == 2 * len(SCENARIOS)
