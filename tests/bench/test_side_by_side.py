"""bench/serve_side_by_side.py's client half against a live gateway (the real engine, the
tiny model): every request generates its whole output (EOS ignored, as the comparison
with llama-server needs), and rounds average into the compared figures."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.serve_side_by_side import WORKLOADS, Server, mean_figures, measure
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import make_test_engine, start_gateway


def test_both_workloads_run_whole_outputs_against_a_live_gateway(tmp_path: Path) -> None:
    gw, stop = start_gateway(tmp_path, engine=make_test_engine(tmp_path), limiter=MemoryLimiter())
    try:
        server = Server("cloister", gw.base_url, gw.model, gw.tenant("bench"))
        args = argparse.Namespace(concurrency=2, warmup_s=0.0, duration_s=1.0)
        runs = {"random": measure(server, "random", args, seed=1)}  # the tiny model's context
        # is 512 tokens: the shared-prefix prompts (650) are for SmolLM2
    finally:
        stop()
    for workload, figures in runs.items():
        assert figures["completed"] > 0 and figures["failed"] == 0, figures["first_error"]
        # 64 tokens each: ignore_eos reached the engine (random prompts hit EOS early).
        expected = figures["completed"] * WORKLOADS[workload][0].output_len
        assert figures["counted_output_throughput"] * figures["duration_s"] == pytest.approx(
            expected, rel=1e-6
        )
    shared, groups = WORKLOADS["shared_prefix"]
    assert (round(shared.input_len * shared.prefix_share), groups) == (600, 4)
    both = mean_figures([runs["random"], runs["random"]])
    assert both["output_tok_s"] == pytest.approx(runs["random"]["output_throughput"], rel=1e-6)
    assert both["completed"] == 2 * runs["random"]["completed"]
