"""`cloister bench serve` against a live gateway (tiny model), and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cloister.cli import main
from cloister.serve_bench.report import percentiles
from cloister.serve_bench.workload import Conversations, WorkloadCell, tenant_prefixes
from tests.utils.live_gateway import LiveGateway
from tests.utils.services import free_port


def _bench(gateway: LiveGateway, keys: list[str], *extra: str) -> list[str]:
    return [
        "bench", "serve", "--base-url", gateway.base_url, "--model", gateway.model,
        *[a for k in keys for a in ("--api-key", k)], "--input-len", "40", "--output-len", "6",
        "--prefix-share", "0.5", "--turns", "1,3", "--concurrency", "1,2",
        "--duration-s", "1.2", "--warmup-s", "0.3", "--vocab", "49152", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_a_sweep_against_a_live_gateway(gateway: LiveGateway, tmp_path: Path) -> None:
    keys = [gateway.tenant("alpha"), gateway.tenant("beta")]
    plot, out_json = tmp_path / "frontier.png", tmp_path / "bench.json"
    args = _bench(gateway, keys, "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000")
    result = CliRunner().invoke(main, [*args, "--plot", str(plot), "--json-out", str(out_json)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert document == json.loads(out_json.read_text())
    runs = document["runs"]
    assert [(r["turns"], r["concurrency"]) for r in runs] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    served = [r for r in gateway.usage.records if r.status == 200]
    assert sum(r["completed"] for r in runs) <= len(served)  # warm-up requests are not counted
    for run in runs:
        assert run["completed"] > 0 and run["failed"] == 0, run
        assert run["output_throughput"] > 0 and run["ttft_ms"]["p50"] > 0
        assert run["ttft_ms"]["p50"] <= run["ttft_ms"]["p95"] <= run["ttft_ms"]["p99"]
        assert run["goodput"] == pytest.approx(run["request_throughput"])  # a loose SLO
        assert run["tenants"] == 2
    # Later turns find their history (and the tenant prefix) in the cache.
    assert runs[2]["cached_token_fraction"] > runs[0]["cached_token_fraction"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench serve" in result.stderr  # the progress bar


def test_a_tight_slo_gives_no_goodput(gateway: LiveGateway) -> None:
    keys = [gateway.tenant("gamma")]
    args = [*_bench(gateway, keys, "--slo-ttft-ms", "0.001", "--slo-tpot-ms", "0.001")]
    args[args.index("--turns") + 1] = "1"
    args[args.index("--concurrency") + 1] = "1"
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout.strip().splitlines()[-1])["runs"]
    assert run["completed"] > 0 and run["goodput"] == 0 and run["slo_attainment"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefix-share", "1.5"], "a prefix share is a fraction in [0, 1)"),
        (["--prefix-share", "nan"], "a prefix share is a fraction in [0, 1)"),
        (["--concurrency", "0"], "every value must be at least 1"),
        (["--input-len", "ten"], "give comma-separated integers"),
        (["--slo-ttft-ms", "100"], "give both --slo-ttft-ms and --slo-tpot-ms"),
        (["--duration-s", "-1"], "--duration-s"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    base = ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m"]
    result = CliRunner().invoke(main, [*base, *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_an_unreachable_server_is_one_clear_error() -> None:
    base = ["bench", "serve", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m"]
    timing = ["--duration-s", "0.3", "--warmup-s", "0", "--concurrency", "1"]
    result = CliRunner().invoke(main, [*base, *timing])
    assert result.exit_code == 1
    assert "no request completed: ConnectionRefusedError" in result.stderr
    bad_url = CliRunner().invoke(main, ["bench", "serve", "--base-url", "ftp://x", "--model", "m"])
    assert bad_url.exit_code == 2 and "must be http(s)://host" in bad_url.output


def test_conversations_grow_and_tenants_keep_their_prefix() -> None:
    cell = WorkloadCell(input_len=20, output_len=5, prefix_share=0.5, turns=2)
    prefixes = tenant_prefixes(cell, tenants=2, vocab=1000, seed=7)
    assert [len(p) for p in prefixes] == [10, 10] and prefixes[0] != prefixes[1]
    users = Conversations(cell, prefixes, vocab=1000, seed=7, worker=1, workers=2)
    first, second, third = users.next(), users.next(), users.next()
    assert first.tenant == second.tenant == 1 and len(first.prompt) == 20
    assert second.prompt[:20] == first.prompt and len(second.prompt) == 20 + 5 + 10
    assert third.tenant == 1 and third.prompt[:10] == tuple(prefixes[1])  # worker 1 + 2k
    again = Conversations(cell, prefixes, vocab=1000, seed=7, worker=1, workers=2)
    assert again.next() == first  # seeded: every server gets the same requests


def test_percentiles_interpolate_as_numpy_does() -> None:
    import numpy as np

    values = [0.005, 0.001, 0.010, 0.002, 0.050, 0.003]
    got = percentiles(values, scale=1.0)
    for q, key in ((50, "p50"), (95, "p95"), (99, "p99")):
        assert got[key] == pytest.approx(float(np.percentile(values, q)))


def test_window_tokens_count_only_what_arrived_inside_the_window() -> None:
    from cloister.serve_bench.client import Timing
    from cloister.serve_bench.runner import tokens_between

    # 4 chunks carrying 8 tokens (2 each): 2 chunks inside [1.0, 3.0).
    t = Timing(ok=True, start=0.0, chunk_times=[0.5, 1.0, 2.9, 3.0], end=3.1, output_tokens=8)
    assert tokens_between(t, 1.0, 3.0) == 4.0
    assert tokens_between(Timing(ok=True, chunk_times=[1.5], output_tokens=0), 1.0, 3.0) == 1.0
    assert tokens_between(Timing(ok=True), 1.0, 3.0) == 0.0
