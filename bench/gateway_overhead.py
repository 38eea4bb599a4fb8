"""Gateway overhead: the same requests through `cloister serve` (HTTP, auth, Redis limiter)
vs straight to an in-process AsyncEngine built with the same options.

The gateway runs as its own process, as in production; the client (httpx) runs in
this one. A tiny random-weight model keeps engine time small so the gateway's share
shows. Three measurements:

  sequential   one request at a time: added p50/p99 latency at idle
  open loop    requests started at a fixed rate (default 200/s), direct and via the
               gateway: added p50/p99 latency under that load
  closed loop  `--concurrency` clients looping: the max sustained requests/s, and
               the CPU seconds each request costs the serving process on each side
               (less sensitive than latency to other work on a shared machine)

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
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloister.settings import Settings  # noqa: E402
from engine.async_engine import AsyncEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from tests.gateway.processes import (  # noqa: E402
    create_tenant_key,
    database,
    gateway_env,
    gateways,
)
from tests.utils.services import delete_prefix  # noqa: E402
from tests.utils.tiny_model import make_tiny_model_dir  # noqa: E402

PROMPT = "Write one sentence about caches."
MESSAGES = [{"role": "user", "content": PROMPT}]


def process_cpu_s(pid: int | None = None) -> float | None:
    """CPU seconds (user + system, all threads) used so far by `pid` (None: this process)."""
    if pid is None:
        return time.process_time()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None  # not Linux: the figure is left out
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def closed_loop(
    call: Callable[[int], Awaitable[bool]], seconds: float, concurrency: int, pid: int | None
) -> tuple[float, float | None]:
    """(completed requests/s, CPU ms per request of `pid`) with `concurrency` looping callers."""
    done = 0
    end = time.perf_counter() + seconds
    cpu0 = process_cpu_s(pid)

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < end:
            i += 1
            # Await first: `done += await ...` would read `done` before the await and
            # lose the increments other workers make meanwhile.
            ok = await call(w * 1_000_000 + i)
            done += ok

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    cpu1 = process_cpu_s(pid)
    per_req = None if cpu0 is None or cpu1 is None or not done else (cpu1 - cpu0) / done * 1000
    return done / seconds, per_req


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def engine_options(env: dict[str, str]) -> dict[str, Any]:
    """The AsyncEngine options `cloister serve` derives from the same environment."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        s = Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {
        "model": s.model,
        "max_model_len": s.max_model_len,
        "kv_cache_bytes": s.kv_cache_bytes,
        "max_num_seqs": s.max_num_seqs,
        "max_waiting": s.max_waiting,
        "attention_backend": s.attention_backend,
        "prefix_cache": "hash",
    }


async def open_loop(call: Callable[[int], Awaitable[None]], rate: float, n: int) -> list[float]:
    """Starts request i at i/rate seconds (never waiting for earlier ones); their latencies."""
    out: list[float] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t)

    await asyncio.gather(*(one(i) for i in range(n)))
    return out


async def sequential(call: Callable[[int], Awaitable[None]], n: int) -> list[float]:
    """Latencies of `n` calls one after another."""
    out = []
    for i in range(n):
        t = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t)
    return out


async def run_direct(options: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Sequential, open-loop and closed-loop figures calling the engine in this process."""
    engine = AsyncEngine.from_options(**options)
    tok = engine.tokenizer
    ids = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    await engine.start()
    tag = secrets.token_hex(3)

    async def call(i: int) -> None:
        stream = engine.submit(ids, params, request_id=f"{tag}-{i}", cache_domain="t:bench")
        async for _ in stream:
            pass

    async def counted(i: int) -> bool:
        await call(-i)
        return True

    try:
        await sequential(call, 5)  # warm-up
        seq = await sequential(call, args.requests)
        loop = await open_loop(call, args.rate, int(args.rate * args.open_seconds))
        rps, cpu = await closed_loop(counted, args.seconds, args.concurrency, None)
    finally:
        await engine.shutdown()
    return {"sequential": seq, "open": loop, "rps": rps, "cpu_ms": cpu}


async def run_gateway(base: str, key: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """Sequential, open-loop and closed-loop figures through HTTP."""
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as client:
        statuses: list[int] = []

        async def call(i: int) -> None:
            r = await client.post(base + "/v1/chat/completions", json=body)
            statuses.append(r.status_code)

        await sequential(call, 5)  # warm-up: connections, the key in the auth cache
        seq = await sequential(call, args.requests)
        loop = await open_loop(call, args.rate, int(args.rate * args.open_seconds))
        failed = [s for s in statuses if s != 200]
        if failed:
            raise RuntimeError(f"{len(failed)} gateway requests failed: {sorted(set(failed))}")

        async def counted(i: int) -> bool:
            r = await client.post(base + "/v1/chat/completions", json=body)
            return r.status_code == 200

        rps, cpu = await closed_loop(counted, args.seconds, args.concurrency, pid)
    return {"sequential": seq, "open": loop, "rps": rps, "cpu_ms": cpu}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def ms(seconds: float) -> float:
    """Seconds as milliseconds, rounded for printing."""
    return round(seconds * 1000, 2)


def figures(direct: list[float], gateway: list[float]) -> dict[str, float]:
    """p50/p99 of both sides and the differences."""
    d50, d99 = statistics.median(direct), percentile(direct, 0.99)
    g50, g99 = statistics.median(gateway), percentile(gateway, 0.99)
    return {
        "direct_p50_ms": ms(d50),
        "direct_p99_ms": ms(d99),
        "gateway_p50_ms": ms(g50),
        "gateway_p99_ms": ms(g99),
        "added_p50_ms": ms(g50 - d50),
        "added_p99_ms": ms(g99 - d99),
    }


def main() -> None:
    """Runs both sides and prints the figures; the last line is JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=200, help="sequential requests per side")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
    ap.add_argument("--open-seconds", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=5.0, help="closed-loop duration")
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
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

    options = engine_options(gateway_env(data, model, **settings))
    direct = asyncio.run(run_direct(options, args))
    try:
        with gateways(data, model, tmp / "logs", [settings]) as (gw,):
            via = asyncio.run(run_gateway(gw.base_url, key, gw.proc.pid, args))
    finally:
        if backend == "redis":
            delete_prefix(client, prefix)

    seq = figures(direct["sequential"], via["sequential"])
    loaded = figures(direct["open"], via["open"])
    result = {
        "limiter": backend,
        "max_tokens": args.max_tokens,
        "sequential_requests": args.requests,
        **{f"seq_{k}": v for k, v in seq.items()},
        "rate": args.rate,
        "open_requests": len(via["open"]),
        **{f"open_{k}": v for k, v in loaded.items()},
        "max_rps": round(via["rps"], 1),
        "direct_max_rps": round(direct["rps"], 1),
        "concurrency": args.concurrency,
        "direct_cpu_ms_per_request": _round(direct["cpu_ms"]),
        "gateway_cpu_ms_per_request": _round(via["cpu_ms"]),
        "added_cpu_ms_per_request": _round(
            None if via["cpu_ms"] is None else via["cpu_ms"] - direct["cpu_ms"]
        ),
    }
    print(f"limiter: {backend}; gateway is a separate `cloister serve` process")
    print(
        f"sequential: direct p50 {seq['direct_p50_ms']} ms, gateway p50 {seq['gateway_p50_ms']}"
        f" ms; added p50 {seq['added_p50_ms']} ms, p99 {seq['added_p99_ms']} ms"
    )
    print(
        f"open loop at {args.rate:g} req/s: direct p50/p99 {loaded['direct_p50_ms']}/"
        f"{loaded['direct_p99_ms']} ms, gateway {loaded['gateway_p50_ms']}/"
        f"{loaded['gateway_p99_ms']} ms; added p50 {loaded['added_p50_ms']} ms, "
        f"p99 {loaded['added_p99_ms']} ms"
    )
    print(
        f"closed loop at concurrency {args.concurrency}: gateway {result['max_rps']} req/s "
        f"(direct {result['direct_max_rps']}); CPU per request: gateway process "
        f"{result['gateway_cpu_ms_per_request']} ms, direct {result['direct_cpu_ms_per_request']}"
        f" ms, added {result['added_cpu_ms_per_request']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
