"""Gateway overhead: the same requests through the gateway (HTTP, auth, Redis limiter,
metering) vs straight to an in-process AsyncEngine built with the same options.

The engine on both sides runs a fake fast model (tests/utils/fast_fake_model.py: the
real engine, tokenizer and chat template, a forward pass that costs almost nothing),
so that what shows is the gateway, not matrix multiplies. The gateway is its own
process, started the way `cloister serve` starts (`run_server`), with the Redis
limiter and the metering writer on SQLite; the client (aiohttp, about a fifth of
httpx's CPU per request) runs in this process, beside the direct engine.

Both sides stay up for the whole run and are measured in alternating rounds, so a
slow patch of a shared machine lands on both. Three measurements:

  sequential   one request at a time: added p50/p99 latency at idle
  open loop    requests started at a fixed rate (default 200/s), never waiting for
               earlier ones: added p50/p99 latency under that load (the goal: p99
               added under 2 ms at 200 requests/s)
  closed loop  `--concurrency` clients looping: the max sustained requests/s, and
               the CPU each request costs the serving process on each side, the
               gateway's split into its event-loop thread and its other threads
               (engine, metering writer), which share one GIL

A further side, the floor (bench/floor_gateway.py; `--no-floor` skips it), is the least
any gateway does: a bare ASGI app on the same server making one Redis round trip and
streaming through the same engine process. What it adds is this machine's price for
a hop over HTTP and Redis; the gateway's own cost is what it adds above it.

With `--litellm`, a peer: LiteLLM's proxy in front of the floor (bench/litellm_peer.py,
installed apart); what it adds above the floor is set against what the gateway adds.

Needs Redis (REDIS_URL, default 127.0.0.1:6379) for the limiter; falls back to the
in-memory limiter when it is unreachable and says so. The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The platform's packages ahead of this folder: run as a script, bench/ comes first on
# the path, and its engine_hop.py (a benchmark) would shadow the engine_hop package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from assembly.engine_options import serve_engine_options  # noqa: E402
from bench.floor_gateway import serve_floor  # noqa: E402
from bench.litellm_peer import litellm_proxy  # noqa: E402
from bench.nearest_rank import nearest_rank  # noqa: E402
from cloister.commands.serve import run_server  # noqa: E402
from engine.fronts.async_engine import AsyncEngine  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from server.process_tuning import loaded_objects_frozen  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests.gateway.processes import (  # noqa: E402
    create_tenant_key,
    database,
    gateways,
)
from tests.utils.fast_fake_model import fast_fake_engine, fast_fake_front  # noqa: E402
from tests.utils.services import delete_prefix  # noqa: E402
from tests.utils.tiny_model import make_tiny_model_dir  # noqa: E402

PROMPT = "Write one sentence about caches."
MESSAGES = [{"role": "user", "content": PROMPT}]
GOAL_P99_MS = 2.0
GOAL_RATE = 200.0

Call = Callable[[int], Awaitable[bool]]


def serve_fake() -> None:
    """The gateway process: `cloister serve`'s path, configured by CLOISTER_*, fake model
    (on a thread or in a child process, as CLOISTER_ENGINE_MODE says); or, with
    CLOISTER_BENCH_SIDE=floor, the bare floor app in front of the same engine."""
    if os.environ.get("CLOISTER_BENCH_SIDE") == "floor":
        serve_floor(MESSAGES)
        return
    settings = Settings()
    run_server(settings, engine=fast_fake_front(settings))


def _stat(path: str) -> list[str] | None:
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_s(pid: int, *, main_thread_only: bool = False) -> float | None:
    """CPU seconds (user + system) used so far by process `pid` and its descendants (the
    engine process), or by its main thread alone (the gateway's event loop)."""
    tick = os.sysconf("SC_CLK_TCK")
    if main_thread_only:
        fields = _stat(f"/proc/{pid}/task/{pid}/stat")
        return None if fields is None else (int(fields[11]) + int(fields[12])) / tick
    parents: dict[int, int] = {}
    used: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(f"{entry}/stat")) is not None:
            parents[int(entry.name)] = int(fields[1])
            used[int(entry.name)] = int(fields[11]) + int(fields[12])
    if pid not in used:
        return None  # not Linux: the figure is left out
    tree, grew = {pid}, True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in tree and child not in tree:
                tree.add(child)
                grew = True
    return sum(used[p] for p in tree) / tick


async def sequential(call: Call, n: int, first: int) -> list[float]:
    """Latencies of `n` calls one after another."""
    out = []
    for i in range(first, first + n):
        t = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t)
    return out


async def open_loop(call: Call, rate: float, n: int, first: int) -> list[float]:
    """Starts request i at i/rate seconds (never waiting for earlier ones); their latencies."""
    out: list[float] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.perf_counter()
        await call(first + i)
        out.append(time.perf_counter() - t)

    await asyncio.gather(*(one(i) for i in range(n)))
    return out


async def closed_loop(
    call: Call, seconds: float, concurrency: int, pid: int, first: int
) -> tuple[float, float | None, float | None]:
    """(completed requests/s, CPU ms per request of process `pid`, of its main thread)
    with `concurrency` looping callers."""
    done = 0
    end = time.perf_counter() + seconds
    cpu0, main0 = cpu_s(pid), cpu_s(pid, main_thread_only=True)

    async def worker(w: int) -> None:
        nonlocal done
        i = first + w * 1_000_000
        while time.perf_counter() < end:
            i += 1
            # Await first: `done += await ...` would read `done` before the await and
            # lose the increments other workers make meanwhile.
            ok = await call(i)
            done += ok

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    cpu1, main1 = cpu_s(pid), cpu_s(pid, main_thread_only=True)

    def per_request(before: float | None, after: float | None) -> float | None:
        return (
            None if before is None or after is None or not done else (after - before) / done * 1000
        )

    return done / seconds, per_request(cpu0, cpu1), per_request(main0, main1)


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for printing."""
    return round(seconds * 1000, 2)


def figures(direct: list[float], gateway: list[float]) -> dict[str, float]:
    """p50/p99 of both sides and the differences."""
    d50, d99 = statistics.median(direct), nearest_rank(direct, 0.99)
    g50, g99 = statistics.median(gateway), nearest_rank(gateway, 0.99)
    return {
        "direct_p50_ms": ms(d50),
        "direct_p99_ms": ms(d99),
        "gateway_p50_ms": ms(g50),
        "gateway_p99_ms": ms(g99),
        "added_p50_ms": ms(g50 - d50),
        "added_p99_ms": ms(g99 - d99),
    }


@dataclass(frozen=True)
class Endpoint:
    """One HTTP side: where it listens, its process (for CPU figures), the key it takes."""

    base_url: str
    pid: int
    key: str


async def measure(
    engine: AsyncEngine, gws: dict[str, Endpoint], args: argparse.Namespace
) -> dict[str, Any]:
    """Every measurement on every side, alternating direct and each HTTP side each round."""
    tok = engine.tokenizer
    ids = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    tag = secrets.token_hex(3)
    statuses: dict[int, int] = {}

    async def direct(i: int) -> bool:
        stream = engine.submit(
            EngineRequest(
                prompt_token_ids=tuple(ids),
                params=params,
                request_id=f"{tag}-{i}",
                cache_domain="t:bench",
            )
        )
        async for _ in stream:
            pass
        return True

    # Under uvicorn's 5 s keep-alive: the other sides' turns leave a gateway's pooled
    # connections idle longer than that, and reusing one as the server closes it
    # resets the request.
    connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=3.0)
    async with aiohttp.ClientSession(connector=connector) as session:

        def via(endpoint: Endpoint) -> Call:
            url = endpoint.base_url + "/v1/chat/completions"
            headers = {"Authorization": f"Bearer {endpoint.key}"}

            async def call(i: int) -> bool:
                async with session.post(url, json=body, headers=headers) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    return r.status == 200

            return call

        sides: dict[str, Call] = {"direct": direct}
        sides.update((name, via(endpoint)) for name, endpoint in gws.items())
        out: dict[str, dict[str, Any]] = {name: {"sequential": [], "open": []} for name in sides}
        for call in sides.values():  # warm-up: connections, the auth cache, the engine
            await sequential(call, 20, 0)
        per_round_seq = max(1, args.requests // args.rounds)
        per_round_open = max(1, int(args.rate * args.open_seconds / args.rounds))
        n = 1_000
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
            for name, call in sides.items():
                await sequential(call, 3, n)  # reconnect after the other sides' turns
                out[name]["sequential"] += await sequential(call, per_round_seq, n + 3)
                n += per_round_seq + 3
            for name, call in sides.items():
                out[name]["open"] += await open_loop(call, args.rate, per_round_open, n)
                n += per_round_open
                await asyncio.sleep(0.2)  # let the queue empty before the other side starts
        for name, call in sides.items():
            pid = gws[name].pid if name in gws else os.getpid()
            rps, cpu, loop_cpu = await closed_loop(call, args.seconds, args.concurrency, pid, n)
            n += 10_000_000
            out[name].update(rps=rps, cpu_ms=cpu, loop_cpu_ms=loop_cpu)
    failed = {s: c for s, c in statuses.items() if s != 200}
    if failed:
        raise RuntimeError(f"gateway requests failed: {failed}")
    return out


VERDICT = {True: "met", False: "NOT met", None: "inconclusive: the direct side's tail is noise"}


def goal_verdict(loaded: dict[str, float], rate: float) -> bool | None:
    """Whether the open loop meets the goal; None when the comparison cannot tell.

    A difference of two p99s means something only if the reference tail is clean: a
    direct p99 far above its p50 (a stall of this shared machine, not the engine)
    would make any gateway look fast.
    """
    if loaded["direct_p99_ms"] > 3 * loaded["direct_p50_ms"] + 2:
        return None
    return rate >= GOAL_RATE and loaded["added_p99_ms"] < GOAL_P99_MS


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def side_figures(direct: dict[str, Any], via: dict[str, Any], rate: float) -> dict[str, Any]:
    """The figures of one gateway side against the direct side."""
    seq = figures(direct["sequential"], via["sequential"])
    loaded = figures(direct["open"], via["open"])
    return {
        "sequential_requests": len(via["sequential"]),
        **{f"seq_{k}": v for k, v in seq.items()},
        "open_requests": len(via["open"]),
        **{f"open_{k}": v for k, v in loaded.items()},
        "goal_met": goal_verdict(loaded, rate),
        "max_rps": round(via["rps"], 1),
        "direct_max_rps": round(direct["rps"], 1),
        "direct_cpu_ms_per_request": _round(direct["cpu_ms"]),
        # The gateway process and its engine process, if it has one.
        "gateway_cpu_ms_per_request": _round(via["cpu_ms"]),
        # The gateway's event-loop thread: HTTP, auth, limiter, tokenizing, responses.
        "gateway_loop_cpu_ms_per_request": _round(via["loop_cpu_ms"]),
        # Everything else: the engine (thread or process) and the metering writer.
        "gateway_other_cpu_ms_per_request": _round(
            None
            if via["cpu_ms"] is None or via["loop_cpu_ms"] is None
            else via["cpu_ms"] - via["loop_cpu_ms"]
        ),
    }


def print_side(title: str, f: dict[str, Any], args: argparse.Namespace) -> None:
    """One gateway side's figures as text."""
    print(f"{title}:")
    print(
        f"  sequential: direct p50 {f['seq_direct_p50_ms']} ms, gateway p50 "
        f"{f['seq_gateway_p50_ms']} ms; added p50 {f['seq_added_p50_ms']} ms, "
        f"p99 {f['seq_added_p99_ms']} ms"
    )
    print(
        f"  open loop at {args.rate:g} req/s: direct p50/p99 {f['open_direct_p50_ms']}/"
        f"{f['open_direct_p99_ms']} ms, gateway {f['open_gateway_p50_ms']}/"
        f"{f['open_gateway_p99_ms']} ms; added p50 {f['open_added_p50_ms']} ms, "
        f"p99 {f['open_added_p99_ms']} ms (goal < {GOAL_P99_MS} ms: {VERDICT[f['goal_met']]})"
    )
    print(
        f"  closed loop at concurrency {args.concurrency}: gateway {f['max_rps']} req/s "
        f"(direct {f['direct_max_rps']}, ratio "
        f"{f['max_rps'] / max(f['direct_max_rps'], 1e-9):.2f}); CPU per request: gateway "
        f"{f['gateway_cpu_ms_per_request']} ms (event loop "
        f"{f['gateway_loop_cpu_ms_per_request']} ms; other threads and child processes, "
        f"such as the engine and the metering writer, "
        f"{f['gateway_other_cpu_ms_per_request']} ms), direct "
        f"{f['direct_cpu_ms_per_request']} ms (engine and client)"
    )


# The gateway sides: the engine loop in a child process (the layout at scale, which
# the Redis limiter implies) and on a thread of the gateway (the embedded default).
ENGINE_MODES = {"gateway": "process", "gateway_thread": "thread"}
# The least any gateway adds on this machine (bench/floor_gateway.py).
FLOOR = "floor"
# LiteLLM's proxy in front of the floor, the peer (bench/litellm_peer.py).
LITELLM = "litellm"
PEER_FIGURES = ("seq_added_p50_ms", "seq_added_p99_ms", "open_added_p50_ms", "open_added_p99_ms")


def peer_comparison(
    gateway: dict[str, Any], floor: dict[str, Any], litellm: dict[str, Any], rate: float
) -> dict[str, Any]:
    """What Cloister's gateway and LiteLLM's proxy each add above the floor, and the ratio."""
    # Past its max rate a side's open-loop queue only grows: its latencies measure the
    # length of the run, not the proxy.
    out: dict[str, Any] = {"litellm_sustains_rate": litellm["max_rps"] >= rate}
    for name in PEER_FIGURES:
        ours = above_floor(gateway, floor, name)
        theirs = above_floor(litellm, floor, name)
        out[name.replace("added", "above_floor")] = {
            "cloister": ours,
            "litellm": theirs,
            # A difference at or under zero is within the noise: no ratio.
            "litellm_over_cloister": round(theirs / ours, 1) if ours > 0 else None,
        }
    out["max_rps"] = {
        "cloister": gateway["max_rps"],
        "litellm": litellm["max_rps"],
        "cloister_over_litellm": round(gateway["max_rps"] / max(litellm["max_rps"], 1e-9), 2),
    }
    return out


def peer_lines(peer: dict[str, Any]) -> list[str]:
    """The peer comparison as text."""
    lines = ["above the floor, Cloister's gateway vs LiteLLM's proxy:"]
    for name, f in peer.items():
        if name == "litellm_sustains_rate":
            continue
        if name.startswith("open_") and not peer["litellm_sustains_rate"]:
            lines.append(
                f"  {name}: Cloister {f['cloister']} ms; LiteLLM cannot sustain the open "
                f"loop's rate here (its queue grows: {f['litellm']} ms)"
            )
            continue
        if name == "max_rps":
            lines.append(
                f"  max req/s: Cloister {f['cloister']}, LiteLLM {f['litellm']} "
                f"({f['cloister_over_litellm']}x)"
            )
            continue
        ratio = f["litellm_over_cloister"]
        lines.append(
            f"  {name}: Cloister {f['cloister']} ms, LiteLLM {f['litellm']} ms"
            + (f" (LiteLLM adds {ratio}x as much)" if ratio is not None else "")
        )
    return lines


def above_floor(side: dict[str, Any], floor: dict[str, Any], name: str) -> float:
    """What `side` adds above the floor in figure `name` (ms, rounded for printing)."""
    return round(side[name] - floor[name], 2)


def floor_verdict(gateway: dict[str, Any], floor: dict[str, Any], rate: float) -> str:
    """One line comparing the gateway's added open-loop latency with the floor's."""
    line = (
        f"at {rate:g} req/s the floor adds p50 {floor['open_added_p50_ms']} ms, "
        f"p99 {floor['open_added_p99_ms']} ms; the gateway adds "
        f"{above_floor(gateway, floor, 'open_added_p50_ms')} ms p50 and "
        f"{above_floor(gateway, floor, 'open_added_p99_ms')} ms p99 above it"
    )
    if floor["open_added_p99_ms"] >= GOAL_P99_MS:
        line += f" (the {GOAL_P99_MS} ms goal is below this machine's floor)"
    return line


def main() -> None:
    """Runs every side and prints the figures; the last line is JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=400, help="sequential requests per side")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--rate", type=float, default=GOAL_RATE, help="open-loop requests/s")
    ap.add_argument("--open-seconds", type=float, default=10.0, help="open-loop time per side")
    ap.add_argument("--rounds", type=int, default=4, help="alternations of the sides")
    ap.add_argument("--seconds", type=float, default=5.0, help="closed-loop duration per side")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--engine-modes",
        default="process,thread",
        help="the gateways' engine modes to measure (process, thread or both)",
    )
    ap.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the floor side (a bare ASGI app with one Redis call, bench/floor_gateway.py)",
    )
    ap.add_argument(
        "--litellm",
        default=os.environ.get("CLOISTER_BENCH_LITELLM"),
        help="LiteLLM's `litellm` command, to measure its proxy as a peer in front of the "
        "floor (installed apart: see bench/litellm_peer.py); default $CLOISTER_BENCH_LITELLM",
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_fake()
        return
    modes = {n: m for n, m in ENGINE_MODES.items() if m in args.engine_modes.split(",")}
    if not modes:
        ap.error("--engine-modes names none of: process, thread")
    if args.litellm and not args.floor:
        ap.error("--litellm measures LiteLLM in front of the floor: drop --no-floor")
    tmp = Path(tempfile.mkdtemp(prefix="cloister-bench-"))
    model = make_tiny_model_dir(tmp)
    data = tmp / "data"
    key = create_tenant_key(database(data), "bench", rpm=10**7, tpm=10**9, max_concurrent=10**4)

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"cloister:bench:{secrets.token_hex(4)}:"
    settings: dict[str, Any] = {"config_refresh_s": 2.0, "log_level": "WARNING"}
    try:
        client = redis.Redis.from_url(url, socket_timeout=0.5)
        client.ping()
        settings.update(redis_url=url, redis_key_prefix=prefix, limiter_fail_mode="closed")
        backend = "redis"
    except redis.RedisError:
        backend = "memory (Redis unreachable)"

    command = [sys.executable, str(Path(__file__).resolve()), "--serve"]
    side_configs = {name: {**settings, "engine_mode": mode} for name, mode in modes.items()}
    if args.floor:
        side_configs[FLOOR] = {**settings, "engine_mode": "process", "bench_side": "floor"}
    try:
        with ExitStack() as stack:
            started = stack.enter_context(
                gateways(data, model, tmp / "logs", list(side_configs.values()), command=command)
            )
            gws = {
                name: Endpoint(gw.base_url, gw.proc.pid, key)
                for name, gw in zip(side_configs, started, strict=True)
            }
            if args.litellm:
                proxy = stack.enter_context(
                    litellm_proxy(args.litellm, "tiny", gws[FLOOR].base_url, tmp)
                )
                gws[LITELLM] = Endpoint(proxy.base_url, proxy.pid, proxy.key)
            options = serve_engine_options(Settings(data_dir=data, **settings))
            engine = fast_fake_engine(**options)

            async def run() -> dict[str, Any]:
                await engine.start()
                try:
                    return await measure(engine, gws, args)
                finally:
                    await engine.shutdown()

            # As `cloister serve` does: long-lived objects out of the collector's walk.
            with loaded_objects_frozen():
                sides = asyncio.run(run())
    finally:
        if backend == "redis":
            delete_prefix(client, prefix)

    per_side = {name: side_figures(sides["direct"], sides[name], args.rate) for name in gws}
    first = next(iter(modes))
    result: dict[str, Any] = {
        "limiter": backend,
        "model": "fast fake (real engine, near-free forward)",
        "max_tokens": args.max_tokens,
        "rate": args.rate,
        "goal_added_p99_ms": GOAL_P99_MS,
        "concurrency": args.concurrency,
        "engine_mode": modes[first],
        **per_side[first],
    }
    for name in list(modes)[1:]:
        result[modes[name]] = per_side[name]
    print(f"limiter: {backend}; each gateway is a separate process serving a fake fast model")
    for name, mode in modes.items():
        where = "a child process" if mode == "process" else "a thread of the gateway"
        print_side(f"gateway, engine loop in {where} (engine_mode={mode})", per_side[name], args)
    if args.floor:
        floor = per_side[FLOOR]
        result[FLOOR] = floor
        result["open_added_p99_over_floor_ms"] = above_floor(
            per_side[first], floor, "open_added_p99_ms"
        )
        print_side(
            "floor: bare ASGI app, one Redis round trip, the same engine process "
            "(no auth, tokenizing, limits, metrics or metering)",
            floor,
            args,
        )
        print(floor_verdict(per_side[first], floor, args.rate))
    if args.litellm:
        peer = per_side[LITELLM]
        result[LITELLM] = peer
        result["peer"] = peer_comparison(per_side[first], per_side[FLOOR], peer, args.rate)
        print_side("peer: LiteLLM's proxy in front of the floor (no rate limiter)", peer, args)
        for line in peer_lines(result["peer"]):
            print(line)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
