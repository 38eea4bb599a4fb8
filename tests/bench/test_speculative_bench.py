"""bench/speculative.py (bad arguments: test_bench_arguments.py): a tiny run
measures both engines on both workloads: real tokens/s and ITL for each, speculation
counters only for the speculating engine, drafts accepted on the grounded workload, the
same greedy output as the peer, and the report in the JSON file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.speculative import Cell, main, percentile


def test_a_cell_reports_per_token_itl_and_acceptance() -> None:
    cell = Cell(tokens=30, seconds=2.0, itl_s=[0.01] * 9 + [0.1], drafts=4, draft_tokens=16)
    cell.accepted, cell.speculated = 12, True
    s = cell.summary()
    assert (s["tok_s"], s["itl_p50_ms"], s["itl_p95_ms"]) == (15.0, 10.0, 100.0)
    assert (s["acceptance_rate"], s["mean_accepted_length"]) == (0.75, 4.0)
    peer = Cell(tokens=10, seconds=1.0).summary()
    assert peer["num_drafts"] is None and peer["acceptance_rate"] is None
    assert peer["itl_p50_ms"] is None and percentile([], 0.5) is None


@pytest.mark.slow
def test_a_tiny_run_measures_both_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "spec.json"
    returned = main(
        [
            "--concurrency", "1,2", "--requests", "2", "--rounds", "1",
            "--text-tokens", "40", "--new-tokens", "12", "--warmup-tokens", "2",
            "--json-out", str(out),
        ]
    )  # fmt: skip
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(returned)) == json.loads(out.read_text())
    cells = {(c["workload"], c["concurrency"], c["config"]): c for c in printed["cells"]}
    assert set(cells) == {
        (w, c, n) for w in ("grounded", "open") for c in (1, 2) for n in ("peer", "ngram")
    }
    for (workload, conc, config), c in cells.items():
        assert c["tokens"] > 0 and c["tok_s"] > 0, c
        assert c["itl_p50_ms"] > 0 and c["itl_p95_ms"] >= c["itl_p50_ms"], c
        if config == "peer":
            assert c["num_drafts"] is None and c["tok_s_ratio"] == 1.0, c
        else:
            assert c["num_draft_tokens"] is not None, c  # the engine reported its counters
            assert c["tok_s_ratio"] == pytest.approx(
                c["tok_s"] / cells[(workload, conc, "peer")]["tok_s"], rel=0.01
            )
        if conc == 1:  # greedy: speculation must not change a token
            assert c["same_output_share"] == 1.0, c
    grounded = cells[("grounded", 1, "ngram")]
    # The answer copies the prompt: n-gram lookup finds drafts and most are accepted.
    assert grounded["num_draft_tokens"] > 0 and 0 < grounded["acceptance_rate"] <= 1
    assert grounded["mean_accepted_length"] > 1
    assert set(printed["ratios"]) == {"grounded_c1", "grounded_c2", "open_c1", "open_c2"}
    assert set(printed["goals_met"]) == {
        "grounded_c1_1.6x",
        "open_c1_0.97x",
        "grounded_c2_1.0x",
        "open_c2_1.0x",
    }
