"""bench/noisy_neighbour.py: bad arguments are refused before anything starts, and a tiny
run (the tiny random model, two victim requests a scenario) ends with one JSON line
that holds every side's figures."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from bench.noisy_neighbour import main
from tests.reliability.noisy import ATTACKS, SCENARIOS
from tests.utils.tiny_model import make_tiny_model_dir

# The tiny model's KV per token in fp32: 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes.
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 16 * 2 * 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--requests", "0"], "--requests: must be at least 1, not 0"),
        (["--requests", "-2"], "--requests: must be at least 1, not -2"),
        (["--requests", "many"], "--requests: 'many' is not a whole number"),
        (["--attacker-concurrency", "2"], "--attacker-concurrency: must be at least 3"),
        (["--request-timeout-s", "0"], "--request-timeout-s: must be a positive number"),
        (["--sides", "during"], "--sides: sides are before and/or after"),
        (["--flood-prompt-tokens", "5000"], "flood_prompt_tokens must be below the pool"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2  # argparse's usage error, before any server starts
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_run_reports_both_sides(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path, tie=False)
    capture = tmp_path / "stdout.txt"
    argv = ["--model", str(model), "--model-name", "tiny", "--no-progress", "--requests", "2"]
    argv += ["--kv-bytes-per-token", str(TINY_KV_BYTES_PER_TOKEN), "--pool-blocks", "32"]
    argv += ["--attack-prompt-tokens", "64", "--flood-prompt-tokens", "128", "--idle-cap-s", "3"]
    argv += ["--logs", str(tmp_path / "logs")]
    with capture.open("w") as out, contextlib.redirect_stdout(out):
        returned = main(argv)
    lines = capture.read_text().strip().splitlines()
    report = json.loads(lines[-1])
    assert report == json.loads(json.dumps(returned))
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
