"""The engine hop's cost: the same requests through the in-process engine client vs the
remote client over loopback to a `cloister engine serve` process.

All sides run the same engine (tests/utils/fast_fake_model.py: the real engine,
tokenizer and scheduler, a forward pass that costs almost nothing) with the same
options, so what shows is the hop: the transport, the wire format, and both ends'
work. The remote server is `cloister engine serve`'s own code path
(`run_engine_server`) serving the fake engine in a child process; the remote client
is the gateway's (`RemoteEngineClient`), measured on both of its transports:

- `remote`: the link, one WebSocket carrying every request's frames (the gateway's
  default; engine_hop.link_client, engine_server.link);
- `remote_http`: one HTTP request each, streamed as compact server-sent events (what
  a gateway behind a Kubernetes InferencePool uses), the peer the link is held to.

Requests go one at a time (short prompts, `--max-tokens` 8, greedy, EOS ignored so
every request makes the same number of tokens), in rounds that take turns going
first, so a slow patch of a shared machine lands on every side.

CPUs: by default (`--cpus split`) the engine server runs on one half of this
machine's CPUs and this process (the gateway's client, and the in-process side) on
the other, each with as many torch threads as CPUs, as a gateway pod and an engine
pod have CPUs of their own. `--cpus shared` puts everything on every CPU: on a small
machine the remote sides then run three busy threads (the engine, the engine
server's event loop, the gateway's) where the in-process side runs two, and the
engine's steps slow for want of a core, not for the hop. Figures: TTFT and
end-to-end p50/p95 on each side and what the hop adds, the added time per output
token (the inter-token gap), and the link's added TTFT over HTTP's. The goal: under
1 ms added at p50 on loopback, over the link. Beside them, the machine's own floor:
bare asyncio round trips over loopback between the same CPUs (bench/loopback_floor.py),
taken in turns with the rounds, whose far side works as long as the in-process engine
takes to a first token: what a first token's round trip adds cannot be less. The last
line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench.loopback_floor import EchoPeer, LoopbackProbe  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine_hop.client import EngineClient  # noqa: E402
from engine_hop.in_process import InProcessEngineClient  # noqa: E402
from engine_hop.remote_client import RemoteEngineClient, fetch_info  # noqa: E402
from server.process_tuning import loaded_objects_frozen, short_gil_switch_interval  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests.utils.fast_fake_model import fast_fake_front  # noqa: E402
from tests.utils.services import free_port, stop_process, wait_http_ok  # noqa: E402

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
# The sides: in-process, the gateway's link to the engine server, HTTP to it.
SIDES = ("in_process", "remote", "remote_http")


def serve_engine() -> None:
    """The child: `cloister engine serve`'s path over the fake engine (CLOISTER_* env)."""
    from cloister.commands.engine_serve import run_engine_server

    # The parent set this process's CPUs before it started (--cpus); torch's threads
    # follow them.
    if hasattr(os, "sched_getaffinity"):
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
    settings = Settings()
    token = None if settings.service_token is None else settings.service_token.get_secret_value()
    front = fast_fake_front(settings, compute_s=float(os.environ.get(STEP_ENV, "0")) / 1e3)
    run_engine_server(settings, token=token, drain_timeout_s=1.0, front=front)


def split_cpus(mode: str) -> tuple[list[int], list[int]] | None:
    """(the engine server's CPUs, this process's) for `--cpus split`: halves of those
    this process may use; None when shared, or where there are not two to split."""
    if mode == "shared" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return cpus[:half], cpus[half:]


def pin(cpus: set[int]) -> None:
    """Keeps this process's threads from here on to `cpus`, torch's too."""
    import torch

    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))


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
    """CPU seconds one side's rounds used: in this process, and in the engine server's
    (None: not readable here); and the rounds' wall time."""

    own_s: float = 0.0
    server_s: float | None = 0.0
    wall_s: float = 0.0  # the rounds' own time, end to end


async def measure(
    clients: dict[str, EngineClient],
    prompts: list[tuple[int, ...]],
    args: Any,
    server_pid: int,
    probe: LoopbackProbe,
) -> tuple[dict[str, list[Timing]], dict[str, Cpu], list[float]]:
    """Warm-up, then rounds of `args.round` requests per side, the sides taking turns
    to go first, each cycle ending with `args.round` bare round trips of `probe`; each
    side's timings, the CPU its rounds used, and the round trips' seconds."""
    sides: dict[str, list[Timing]] = {name: [] for name in clients}
    cpu = {name: Cpu() for name in clients}
    floor: list[float] = []
    for i in range(args.warmup):
        for name, client in clients.items():
            await one(client, prompts[i % len(prompts)], args.max_tokens, f"w-{name}-{i}")
        await probe.round_trip()
    done = 0
    order = list(clients)
    while done < args.requests:
        for name in order:
            own, server, wall = time.process_time(), cpu_s(server_pid), time.perf_counter()
            for start in range(0, args.round, args.concurrency):
                batch = range(done + start, done + min(args.round, start + args.concurrency))
                sides[name].extend(
                    await asyncio.gather(
                        *(
                            one(
                                clients[name],
                                prompts[i % len(prompts)],
                                args.max_tokens,
                                f"{name}-{i}",
                            )
                            for i in batch
                        )
                    )
                )
            cpu[name].wall_s += time.perf_counter() - wall
            cpu[name].own_s += time.process_time() - own
            after, used = cpu_s(server_pid), cpu[name]
            if server is None or after is None or used.server_s is None:
                used.server_s = None
            else:
                used.server_s += after - server
        # The echo works as long as the in-process engine took to a first token lately.
        recent = [t.ttft_s for t in sides.get("in_process", [])[-args.round :]]
        hold_s = statistics.median(recent) if recent else 0.0
        for _ in range(args.round):
            floor.append(await probe.round_trip(hold_s))
        done += args.round
        order = order[1:] + order[:1]  # no side always goes first
    timings = {name: timings[: args.requests] for name, timings in sides.items()}
    return timings, cpu, floor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300, help="requests per side")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--round", type=int, default=10, help="requests per side per round")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests in flight at once on a side (default 1: the hop alone; more shows "
        "what the hop costs a batch, as output tokens per second per side)",
    )
    p.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="each forward pass of the fake model waits this long with the GIL released, "
        "as a real model's kernels run (default 0: the step is the engine's own work)",
    )
    p.add_argument(
        "--engine-mode",
        choices=("thread", "process"),
        default="thread",
        help="where each side's engine runs (CLOISTER_ENGINE_MODE): on a thread of the "
        "serving process (the default), or in a child process of its own, so that the "
        "engine server's event loop never waits for the engine's GIL",
    )
    p.add_argument(
        "--cpus",
        choices=("split", "shared"),
        default="split",
        help="split (the default): the engine server on half of the CPUs, this process "
        "on the other half, as separate pods are; shared: everything on every CPU",
    )
    p.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the comparison; prints a table, then the JSON figures as the last line."""
    args = parse_args(argv)
    if args.serve_engine:
        serve_engine()
        return {}
    # The same settings the engine process gets, without touching this process's
    # environment (a caller, such as the test suite, keeps its own).
    engine_env = {**ENGINE_ENV, "CLOISTER_ENGINE_MODE": args.engine_mode}
    split = split_cpus(args.cpus)
    if split is not None:
        pin(set(split[1]))
    settings = Settings(**{k.removeprefix("CLOISTER_").lower(): v for k, v in engine_env.items()})
    front = fast_fake_front(settings, compute_s=args.step_ms / 1e3)
    tokenizer = front.tokenizer
    prompts = [tuple(tokenizer.encode(f"Request {i}: name a colour.")) for i in range(64)]
    engine_cpus = None if split is None else set(split[0])
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "engine.log"
        env = {**os.environ, **engine_env, "CLOISTER_SERVICE_TOKEN": TOKEN}
        env["CLOISTER_DATA_DIR"] = tmp
        env["CLOISTER_PORT"] = str(port)
        env[STEP_ENV] = str(args.step_ms)
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        with log_path.open("wb") as log:
            # Pinned before it starts, so that its every thread, from the first, stays
            # on its CPUs.
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve-engine"],
                env=env,
                stdout=log,
                stderr=log,
                preexec_fn=None
                if engine_cpus is None
                else lambda: os.sched_setaffinity(0, engine_cpus),
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http_ok(proc, url + "/health", log_path, 120.0, "engine server")
            # The machine's own round trips between the same CPUs, with nothing above
            # the socket, taken in turns with the requests. This process serves as
            # `cloister serve` does; the engine server as `cloister engine serve` does.
            with (
                EchoPeer(engine_cpus) as echo_port,
                loaded_objects_frozen(),
                short_gil_switch_interval(),
            ):
                timings, cpu, floor = asyncio.run(
                    _run(front, url, tokenizer, prompts, args, proc.pid, echo_port)
                )
        finally:
            stop_process(proc)
    floor_p50_ms = round(pct(floor, 50) * 1e3, 4)
    local, remote, http = (summary(timings[side]) for side in SIDES)
    hop, hop_http = added(local, remote), added(local, http)
    report: dict[str, Any] = {
        "bench": "engine_hop",
        "requests_per_side": args.requests,
        "max_tokens": args.max_tokens,
        "step_ms": args.step_ms,
        "engine_mode": args.engine_mode,
        "cpu_split": "shared" if split is None else {"engine_server": split[0], "this": split[1]},
        "tokens_per_request": statistics.fmean(t.tokens for t in timings["remote"]),
        "in_process": local,
        "remote": remote,  # the gateway's transport: the link
        "added": hop,
        "remote_http": http,  # one HTTP request each: the peer transport
        "added_http": hop_http,
        # A bare asyncio round trip over loopback between the same CPUs: a floor under
        # the TTFT the hop adds (bench/loopback_floor.py).
        "loopback_rtt_p50_ms": floor_p50_ms,
        "loopback_rtt_p95_ms": round(pct(floor, 95) * 1e3, 4),
        # What the link's code and the second process add above that floor.
        "link_ttft_added_above_floor_ms": round(hop["ttft_p50_ms"] - floor_p50_ms, 4),
        "goal_added_p50_ms": GOAL_ADDED_P50_MS,
        "meets_goal": hop["ttft_p50_ms"] < GOAL_ADDED_P50_MS
        and hop["e2e_p50_ms"] < GOAL_ADDED_P50_MS,
        # CPU per request: in-process (client and engine in this process) vs remote
        # (the client here plus the engine server's process); the difference is the hop's.
        "cpu_per_request_ms": _cpu_figures(cpu, args.requests),
        "concurrency": args.concurrency,
        # Output tokens per second of each side's rounds: with --concurrency, what the
        # hop costs a batch.
        "output_tokens_per_s": {
            side: round(sum(t.tokens for t in timings[side]) / cpu[side].wall_s, 1)
            for side in SIDES
        },
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }
    where = "shared" if split is None else f"engine server on {split[0]}, this on {split[1]}"
    print(f"CPUs: {where}")
    print(f"{'':12}{'in-process':>12}{'link':>10}{'added':>8}{'http':>10}{'added':>8}   (ms)")
    for key in local:
        if key.endswith("_mean_ms"):
            continue
        print(
            f"{key[:-3]:12}{local[key]:12.3f}{remote[key]:10.3f}{hop[key]:8.3f}"
            f"{http[key]:10.3f}{hop_http[key]:8.3f}"
        )
    tps = report["output_tokens_per_s"]
    print(
        f"output tokens/s at concurrency {args.concurrency}: in-process {tps['in_process']},"
        f" link {tps['remote']}, http {tps['remote_http']}"
    )
    c = report["cpu_per_request_ms"]
    print(
        f"CPU per request (ms): in-process {c['in_process']}, link {c['remote']},"
        f" http {c['remote_http']} (client + server)"
    )
    ratio = hop["ttft_p50_ms"] / hop_http["ttft_p50_ms"] if hop_http["ttft_p50_ms"] > 0 else None
    print(f"TTFT added, link / http at p50: {ratio if ratio is None else round(ratio, 3)}")
    print(
        f"bare asyncio round trip over loopback between the same CPUs: p50 {floor_p50_ms:.3f} ms"
        f" (a floor under the TTFT added; link / floor: {hop['ttft_p50_ms'] / floor_p50_ms:.2f})"
    )
    print(json.dumps(report))
    return report


def _cpu_figures(cpu: dict[str, Cpu], requests: int) -> dict[str, float | None]:
    """CPU milliseconds per request: this process alone in-process; client plus server
    for each remote side (None where the server's figure is not readable)."""
    figures: dict[str, float | None] = {
        "in_process": round(cpu["in_process"].own_s / requests * 1e3, 4)
    }
    for side in SIDES[1:]:
        used = cpu[side]
        total = None if used.server_s is None else used.own_s + used.server_s
        figures[side] = None if total is None else round(total / requests * 1e3, 4)
    return figures


async def _run(
    front: Any,
    url: str,
    tokenizer: Any,
    prompts: list[tuple[int, ...]],
    args: Any,
    server_pid: int,
    echo_port: int,
) -> tuple[dict[str, list[Timing]], dict[str, Cpu], list[float]]:
    info = fetch_info(url, TOKEN, wait_s=30)
    clients: dict[str, Any] = {"in_process": InProcessEngineClient(front, model_name="fast-fake")}
    for side, transport in (("remote", "link"), ("remote_http", "http")):
        clients[side] = RemoteEngineClient(
            url, token=TOKEN, tokenizer=tokenizer, info=info, transport=transport
        )
    for client in clients.values():
        await client.start()
    probe = await LoopbackProbe.connect(echo_port)
    try:
        return await measure(clients, prompts, args, server_pid, probe)
    finally:
        probe.close()
        for client in clients.values():
            await client.shutdown()


if __name__ == "__main__":
    main()
