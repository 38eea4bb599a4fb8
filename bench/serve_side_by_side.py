"""`cloister serve` against llama.cpp's `llama-server`, side by side on one machine.

Both serve the bundled SmolLM2-135M-Instruct: Cloister its GGUF's weights through its
own engine (by default `--weight-quant auto`, which runs its Q4_1 weights on the int4
path and re-finds them; `--weight-quant none` for fp32),
llama-server the same GGUF file (8 slots, continuous batching, as many threads as
cores). The same client (cloister.serve_bench, closed loop, fixed duration after a
warm-up, greedy, `ignore_eos` so that both generate every requested token) sends the
same seeded requests to each, alternating server by server, round by round, so that
a noisy machine hurts both alike. Workloads, as in the issue:

- random: 200-token prompts of random ids, 64 output tokens, concurrency 8;
- shared-prefix: 4 groups with a 600-token common prefix and 50-token questions,
  64 output tokens, concurrency 8 (SGLang's generated-shared-prefix shape).

With `--sglang DIR` (peers-setup's /tmp/peers/sgl) SGLang's `bench_serving` also runs
the random workload once against each server, and its output throughput is printed
beside ours (the benchmark client's agreement check).

    python bench/serve_side_by_side.py [--peers /tmp/peers] [--engine-mode thread]
        [--weight-quant auto|none|int8|int4] [--itl-budget-ms MS] [--rounds 2] [--duration-s 40] [--warmup-s 8] [--sglang DIR]

It needs `../shared/tools/peers-setup` (llama-server built into /tmp/peers). The last
line is JSON: per workload each server's figures (mean over rounds), the ratios and
the issue's goals (>= 1.5x llama-server's output throughput; median ITL at or below
llama-server's; p99 TTFT under 1 s on the random workload).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloister.serve_bench.client import CompletionClient, Timing
from cloister.serve_bench.report import summarize
from cloister.serve_bench.runner import RunSpec, run_closed_loop
from cloister.serve_bench.workload import WorkloadCell

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "random": (WorkloadCell(200, 64, 0.0, 1), 1),
    "shared_prefix": (WorkloadCell(650, 64, 600 / 650, 1), 4),  # (cell, prefix groups)
}
GOAL_THROUGHPUT = 1.5


@dataclass(frozen=True)
class Server:
    """A running server the client can reach."""

    name: str
    base_url: str
    model: str
    key: str


class FullLengthClient(CompletionClient):
    """Asks every server to ignore EOS: random prompts would end at different lengths."""

    def send(self, tenant: int, prompt: tuple[int, ...], max_tokens: int, **extra: Any) -> Timing:
        """`CompletionClient.send` with `ignore_eos`."""
        return super().send(tenant, prompt, max_tokens, ignore_eos=True, **extra)


def free_port() -> int:
    """A port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str, ok: tuple[int, ...], deadline_s: float, proc: subprocess.Popen[bytes]
) -> None:
    """Polls `url` until it answers one of `ok`; fails if `proc` exits first."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status in ok:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {deadline_s:.0f} s")


def cloister_cli(data: Path, *args: str) -> str:
    """Runs one `cloister` command on the benchmark's data folder; its stdout."""
    exe = ROOT / ".venv" / "bin" / "cloister"
    done = subprocess.run(
        [str(exe), *args, "--data-dir", str(data)], check=True, capture_output=True, text=True
    )
    return done.stdout


@contextmanager
def cloister_server(args: argparse.Namespace, log: Path) -> Iterator[Server]:
    """`cloister serve` on a fresh data folder, with one unlimited tenant key."""
    data = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    port = free_port()
    cmd = [
        str(ROOT / ".venv" / "bin" / "cloister"),
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data),
        "--engine-mode",
        args.engine_mode,
        "--weight-quant",
        args.weight_quant,
    ]
    if args.itl_budget_ms is not None:
        cmd += ["--itl-budget-ms", str(args.itl_budget_ms)]
    env = {**os.environ, "CLOISTER_LOG_FORMAT": "json", "CLOISTER_ENGINE_LOG_INTERVAL_S": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", (401,), 300, proc)
        cloister_cli(data, "tenants", "create", "bench")
        key = json.loads(cloister_cli(data, "keys", "create", "--tenant", "bench", "--json"))
        cloister_cli(data, "tenants", "set-limits", "bench", "--rpm", "none", "--tpm", "none")
        yield Server("cloister", f"http://127.0.0.1:{port}", "smollm2-135m-instruct", key["key"])
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def llama_server(args: argparse.Namespace, gguf: Path, log: Path) -> Iterator[Server]:
    """llama.cpp's server on the same GGUF: 8 slots, continuous batching."""
    exe = args.peers / "lcpp" / "build" / "bin" / "llama-server"
    if not exe.exists():
        raise SystemExit(f"{exe} is missing: run ../shared/tools/peers-setup first")
    port = free_port()
    threads = str(os.cpu_count() or 2)
    cmd = [str(exe), "-m", str(gguf), "--alias", "smollm2", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "-np", "8", "-c", "8192", "-t", threads, "-tb", threads, "-cb"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", (200,), 120, proc)
        yield Server("llama-server", f"http://127.0.0.1:{port}", "smollm2", "none")
    finally:
        proc.terminate()
        proc.wait(60)


def measure(server: Server, workload: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One closed-loop run of `workload` against `server`."""
    cell, groups = WORKLOADS[workload]
    client = FullLengthClient(server.base_url, server.model, [server.key], 600.0)
    spec = RunSpec(cell, args.concurrency, args.warmup_s, args.duration_s, groups, 49152, seed)
    return summarize(run_closed_loop(client, spec), None)


def sglang_throughput(server: Server, args: argparse.Namespace, out: Path) -> float | None:
    """SGLang's bench_serving on the random workload; its output token throughput."""
    tok = args.peers / "tok"
    cmd = [
        str(args.peers / "venv" / "bin" / "python"),
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "vllm",
        "--base-url",
        server.base_url,
        "--model",
        server.model,
        "--tokenizer",
        str(tok),
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "200",
        "--random-output-len",
        "64",
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        "48",
        "--max-concurrency",
        str(args.concurrency),
        "--seed",
        "7",
        "--extra-request-body",
        json.dumps({"ignore_eos": True}),
        "--output-file",
        str(out),
    ]
    out.unlink(missing_ok=True)  # bench_serving appends to its output file
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(args.sglang),
        "OPENAI_API_KEY": server.key,
    }
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0 or not out.exists():
        print(f"  sglang bench_serving failed: {done.stderr[-400:]}", file=sys.stderr)
        return None
    record = json.loads(out.read_text().strip().splitlines()[-1])
    return float(record["output_throughput"])


def mean_figures(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The figures compared, averaged over rounds."""
    return {
        "output_tok_s": statistics.fmean(r["output_throughput"] for r in runs),
        "ttft_p50_ms": statistics.fmean(r["ttft_ms"]["p50"] for r in runs),
        "ttft_p99_ms": statistics.fmean(r["ttft_ms"]["p99"] for r in runs),
        "itl_p50_ms": statistics.fmean(r["itl_ms"]["p50"] for r in runs),
        "itl_p99_ms": statistics.fmean(r["itl_ms"]["p99"] for r in runs),
        "completed": sum(r["completed"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs both servers through every workload and prints the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, default=Path("/tmp/peers"))
    parser.add_argument("--engine-mode", choices=("thread", "process"), default="thread")
    parser.add_argument(
        "--weight-quant", choices=("auto", "none", "int8", "int4"), default="auto"
    )  # auto: `cloister serve`'s own default
    parser.add_argument(
        "--itl-budget-ms", type=float, help="Cloister's ITL budget (default: serve's own)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workloads", default="random,shared_prefix")
    parser.add_argument("--sglang", type=Path, help="SGLang's client folder (peers' sgl)")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "side-by-side")
    args = parser.parse_args(argv)
    from engine.model.loader import default_model_path

    gguf = Path(default_model_path())
    workloads = [w for w in args.workloads.split(",") if w]
    args.logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {"cloister": [], "llama-server": []} for w in workloads
    }
    agreement: dict[str, dict[str, float | None]] = {}
    with (
        cloister_server(args, args.logs / "cloister.log") as ours,
        llama_server(args, gguf, args.logs / "llama.log") as peer,
    ):
        servers = [ours, peer]
        for server in servers:  # warm-up: first requests, caches, thread pools
            measure(
                server,
                "random",
                argparse.Namespace(**{**vars(args), "duration_s": 3.0, "warmup_s": 0.0}),
                999,
            )
        for r in range(args.rounds):
            for workload in workloads:
                order = servers if r % 2 == 0 else servers[::-1]
                for server in order:
                    figures = measure(server, workload, args, seed=r + 1)
                    runs[workload][server.name].append(figures)
                    print(
                        f"  round {r + 1} {workload:13s} {server.name:12s} "
                        f"{figures['output_throughput']:7.1f} tok/s  "
                        f"TTFT p50 {figures['ttft_ms']['p50']:7.0f} ms  "
                        f"ITL p50 {figures['itl_ms']['p50']:6.1f} ms  "
                        f"ok {figures['completed']} fail {figures['failed']}",
                        file=sys.stderr,
                        flush=True,
                    )
        if args.sglang is not None:
            for server in servers:
                ours_figures = measure(server, "random", args, seed=7)
                theirs = sglang_throughput(server, args, args.logs / f"sglang-{server.name}.jsonl")
                agreement[server.name] = {
                    "cloister_bench": round(ours_figures["output_throughput"], 2),
                    "sglang_bench_serving": None if theirs is None else round(theirs, 2),
                }
    summary: dict[str, Any] = {
        "engine_mode": args.engine_mode,
        "weight_quant": args.weight_quant,
        "rounds": args.rounds,
        "duration_s": args.duration_s,
        "concurrency": args.concurrency,
        "cores": os.cpu_count(),
        "workloads": {},
    }
    print(
        f"{'workload':14s} {'server':13s} {'tok/s':>8s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'ITL p50':>8s}"
    )
    for workload in workloads:
        a = mean_figures(runs[workload]["cloister"])
        b = mean_figures(runs[workload]["llama-server"])
        for name, f in (("cloister", a), ("llama-server", b)):
            print(
                f"{workload:14s} {name:13s} {f['output_tok_s']:8.1f} {f['ttft_p50_ms']:8.0f}ms "
                f"{f['ttft_p99_ms']:8.0f}ms {f['itl_p50_ms']:6.1f}ms"
            )
        ratio = a["output_tok_s"] / b["output_tok_s"] if b["output_tok_s"] else 0.0
        itl_ratio = a["itl_p50_ms"] / b["itl_p50_ms"] if b["itl_p50_ms"] else 0.0
        print(f"{workload:14s} throughput {ratio:.2f}x llama-server, ITL p50 {itl_ratio:.2f}x")
        summary["workloads"][workload] = {
            "cloister": {k: round(v, 2) for k, v in a.items()},
            "llama_server": {k: round(v, 2) for k, v in b.items()},
            "throughput_ratio": round(ratio, 3),
            "itl_p50_ratio": round(itl_ratio, 3),
        }
    if agreement:
        summary["client_agreement"] = agreement
        for name, pair in agreement.items():
            print(
                f"client agreement on {name}: ours {pair['cloister_bench']} tok/s, "
                f"SGLang's {pair['sglang_bench_serving']} tok/s"
            )
    rand = summary["workloads"].get("random")
    if rand is not None:
        summary["goal_throughput_1_5x"] = rand["throughput_ratio"] >= GOAL_THROUGHPUT
        summary["goal_itl_at_or_below"] = rand["itl_p50_ratio"] <= 1.0
        summary["goal_ttft_p99_under_1s"] = rand["cloister"]["ttft_p99_ms"] < 1000.0
    print(json.dumps(summary, sort_keys=True))
    return summary


if __name__ == "__main__":
    main()
