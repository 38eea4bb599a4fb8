"""The engine hop's cost: the same requests through the in-process engine client vs the
remote client over loopback to a `cloister engine serve` process.

Both sides run the same engine (tests/utils/fast_fake_model.py: the real engine,
tokenizer and scheduler, a forward pass that costs almost nothing) with the same
options, so what shows is the hop: the wire format, HTTP on loopback, the server's
SSE and the client's parsing. The remote server is `cloister engine serve`'s own
code path (`run_engine_server`) serving the fake engine in a child process; the
remote client is the gateway's (`RemoteEngineClient`: aiohttp, orjson, the compact
`x-cloister-wire: events` chunks that carry the engine event alone).

Requests go one at a time (short prompts, `--max-tokens` 8, greedy, EOS ignored so
every request makes the same number of tokens), in alternating rounds, so a slow
patch of a shared machine lands on both sides. Figures: TTFT and end-to-end p50/p95
on each side and what the hop adds, and the added time per output token (the
inter-token gap). The goal: under 1 ms added at p50 on loopback. The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from gateway.engine_client import EngineClient, InProcessEngineClient  # noqa: E402
from gateway.remote_engine import RemoteEngineClient, fetch_info  # noqa: E402
from server.settings import Settings  # noqa: E402
from server.wiring import load_engine, serve_engine_options  # noqa: E402
from tests.gateway.conftest import free_port  # noqa: E402
from tests.utils.fast_fake_model import fast_fake_llm_engine  # noqa: E402
from tests.utils.services import stop_process, wait_http_ok  # noqa: E402

GOAL_ADDED_P50_MS = 1.0
TOKEN = "svc-" + "engine-hop-bench-token-0123"
ENGINE_ENV = {
    "CLOISTER_MODEL_NAME": "fast-fake",
    "CLOISTER_ATTENTION_BACKEND": "torch",
    "CLOISTER_DEVICE": "cpu",
    "CLOISTER_MAX_MODEL_LEN": "512",
    "CLOISTER_KV_CACHE_BYTES": str(8 * 1024 * 1024),
    "CLOISTER_BLOCK_SIZE": "16",
    "CLOISTER_LOG_LEVEL": "WARNING",
}


STEP_ENV = "CLOISTER_BENCH_FAKE_STEP_MS"  # the child's --step-ms


def fake_front(settings: Settings, step_ms: float) -> Any:
    """The fake fast engine with `cloister serve`'s options from `settings`, whose forward
    pass waits `step_ms` with the GIL released."""
    fake = functools.partial(
        fast_fake_llm_engine, compute_s=step_ms / 1e3, **serve_engine_options(settings)
    )
    return load_engine(settings, factory=fake)


def serve_engine() -> None:
    """The child: `cloister engine serve`'s path over the fake engine (CLOISTER_* env)."""
    from cloister.commands.engine_serve import run_engine_server

    settings = Settings()
    token = None if settings.service_token is None else settings.service_token.get_secret_value()
    front = fake_front(settings, float(os.environ.get(STEP_ENV, "0")))
    run_engine_server(settings, token=token, drain_timeout_s=1.0, front=front)


@dataclass(frozen=True)
class Timing:
    """One request: seconds to the first token and to the end, tokens made."""

    ttft_s: float
    e2e_s: float
    tokens: int

    @property
    def per_token_s(self) -> float | None:
        """The mean gap between tokens after the first."""
        return None if self.tokens < 2 else (self.e2e_s - self.ttft_s) / (self.tokens - 1)


async def one(client: EngineClient, prompt: tuple[int, ...], max_tokens: int, rid: str) -> Timing:
    """Submits one greedy request and times its stream."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = EngineRequest(prompt_token_ids=prompt, params=params, request_id=rid)
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    async for event in client.submit(request):
        new = sum(len(d.token_ids) for d in event.deltas)
        if new and first is None:
            first = time.perf_counter()
        tokens += new
        if event.finished:
            break
    end = time.perf_counter()
    return Timing((first or end) - start, end - start, tokens)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank on the sorted values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary(timings: list[Timing]) -> dict[str, float]:
    """p50/p95 of TTFT, end-to-end and per-token time, in milliseconds."""
    ttft = [t.ttft_s for t in timings]
    e2e = [t.e2e_s for t in timings]
    per_token = [p for t in timings if (p := t.per_token_s) is not None]
    out = {}
    for name, values in (("ttft", ttft), ("e2e", e2e), ("per_token", per_token)):
        if values:
            out[f"{name}_p50_ms"] = round(pct(values, 50) * 1e3, 4)
            out[f"{name}_p95_ms"] = round(pct(values, 95) * 1e3, 4)
            out[f"{name}_mean_ms"] = round(statistics.fmean(values) * 1e3, 4)
    return out


def added(local: dict[str, float], remote: dict[str, float]) -> dict[str, float]:
    """Remote minus in-process, figure by figure."""
    return {k: round(remote[k] - local[k], 4) for k in local if k in remote}


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` used so far (None off Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Cpu:
    """CPU seconds each side's rounds used: this process, and the engine server's."""

    local_s: float = 0.0
    remote_client_s: float = 0.0
    remote_server_s: float | None = 0.0


async def measure(
    local: EngineClient,
    remote: EngineClient,
    prompts: list[tuple[int, ...]],
    args: Any,
    server_pid: int,
    cpu: Cpu,
) -> tuple[list[Timing], list[Timing]]:
    """Warm-up, then alternating rounds of `args.round` requests per side; adds the CPU
    each side's rounds used to `cpu`."""
    sides: dict[str, list[Timing]] = {"local": [], "remote": []}
    clients = {"local": local, "remote": remote}
    for i in range(args.warmup):
        for name, client in clients.items():
            await one(client, prompts[i % len(prompts)], args.max_tokens, f"w-{name}-{i}")
    done = 0
    order = ["local", "remote"]
    while done < args.requests:
        for name in order:
            own, server = time.process_time(), cpu_s(server_pid)
            for j in range(args.round):
                i = done + j
                prompt = prompts[i % len(prompts)]
                sides[name].append(await one(clients[name], prompt, args.max_tokens, f"{name}-{i}"))
            own = time.process_time() - own
            if name == "local":
                cpu.local_s += own
                continue
            cpu.remote_client_s += own
            after = cpu_s(server_pid)
            if server is None or after is None or cpu.remote_server_s is None:
                cpu.remote_server_s = None
            else:
                cpu.remote_server_s += after - server
        done += args.round
        order.reverse()  # neither side always goes first
    return sides["local"][: args.requests], sides["remote"][: args.requests]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300, help="requests per side")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--round", type=int, default=10, help="requests per side per round")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="each forward pass of the fake model waits this long with the GIL released, "
        "as a real model's kernels run (default 0: the step is the engine's own work)",
    )
    p.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the comparison; prints a table, then the JSON figures as the last line."""
    args = parse_args(argv)
    if args.serve_engine:
        serve_engine()
        return {}
    # The same settings the engine process gets, without touching this process's
    # environment (a caller, such as the test suite, keeps its own).
    settings = Settings(**{k.removeprefix("CLOISTER_").lower(): v for k, v in ENGINE_ENV.items()})
    front = fake_front(settings, args.step_ms)
    tokenizer = front.tokenizer
    prompts = [tuple(tokenizer.encode(f"Request {i}: name a colour.")) for i in range(64)]
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "engine.log"
        env = {**os.environ, **ENGINE_ENV, "CLOISTER_SERVICE_TOKEN": TOKEN}
        env["CLOISTER_DATA_DIR"] = tmp
        env["CLOISTER_PORT"] = str(port)
        env[STEP_ENV] = str(args.step_ms)
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve-engine"], env=env, stdout=log, stderr=log
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http_ok(proc, url + "/health", log_path, 120.0, "engine server")
            cpu = Cpu()
            local_timings, remote_timings = asyncio.run(
                _run(front, url, tokenizer, prompts, args, proc.pid, cpu)
            )
        finally:
            stop_process(proc)
    local, remote = summary(local_timings), summary(remote_timings)
    hop = added(local, remote)
    report: dict[str, Any] = {
        "bench": "engine_hop",
        "requests_per_side": args.requests,
        "max_tokens": args.max_tokens,
        "step_ms": args.step_ms,
        "tokens_per_request": statistics.fmean(t.tokens for t in remote_timings),
        "in_process": local,
        "remote": remote,
        "added": hop,
        "goal_added_p50_ms": GOAL_ADDED_P50_MS,
        "meets_goal": hop["ttft_p50_ms"] < GOAL_ADDED_P50_MS
        and hop["e2e_p50_ms"] < GOAL_ADDED_P50_MS,
        # CPU per request: in-process (client and engine in this process) vs remote
        # (the client here plus the engine server's process); the difference is the hop's.
        "cpu_per_request_ms": _cpu_figures(cpu, args.requests),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }
    print(f"{'':12}{'in-process':>12}{'remote':>12}{'added':>12}   (ms)")
    for key in local:
        if key.endswith("_mean_ms"):
            continue
        print(f"{key[:-3]:12}{local[key]:12.3f}{remote[key]:12.3f}{hop[key]:12.3f}")
    c = report["cpu_per_request_ms"]
    print(
        f"CPU per request: in-process {c['in_process']:.3f} ms, remote {c['remote_client']:.3f}"
        f" (client) + {c['remote_server']} (server) ms, added {c['added']} ms"
    )
    print(json.dumps(report))
    return report


def _cpu_figures(cpu: Cpu, requests: int) -> dict[str, float | None]:
    def per(value: float | None) -> float | None:
        return None if value is None else round(value / requests * 1e3, 4)

    server = per(cpu.remote_server_s)
    local, client = per(cpu.local_s), per(cpu.remote_client_s)
    assert local is not None and client is not None
    total = None if server is None else round(client + server, 4)
    return {
        "in_process": local,
        "remote_client": client,
        "remote_server": server,
        "remote_total": total,
        "added": None if total is None else round(total - local, 4),
    }


async def _run(
    front: Any,
    url: str,
    tokenizer: Any,
    prompts: list[tuple[int, ...]],
    args: Any,
    server_pid: int,
    cpu: Cpu,
) -> tuple[list[Timing], list[Timing]]:
    local = InProcessEngineClient(front, model_name="fast-fake")
    remote = RemoteEngineClient(
        url, token=TOKEN, tokenizer=tokenizer, info=fetch_info(url, TOKEN, wait_s=30)
    )
    await local.start()
    await remote.start()
    try:
        return await measure(local, remote, prompts, args, server_pid, cpu)
    finally:
        await remote.shutdown()
        await local.shutdown()


if __name__ == "__main__":
    main()
