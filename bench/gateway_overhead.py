"""Gateway overhead: the same requests through HTTP + auth + Redis limiter vs the engine directly.

A tiny random-weight model keeps engine time small so the gateway's share shows.
Prints added p50/p99 latency per request and the max sustained requests/s through
the gateway; the last line is JSON. Needs Redis (REDIS_URL, default 127.0.0.1:6379);
falls back to the in-memory limiter when it is unreachable and says so.
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
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.async_engine import AsyncEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from tenancy.limiter.memory import MemoryLimiter  # noqa: E402
from tenancy.limiter.redis_limiter import RedisLimiter  # noqa: E402
from tests.gateway.conftest import start_gateway  # noqa: E402
from tests.utils.tiny_model import make_tiny_model_dir  # noqa: E402

PROMPT = "Write one sentence about caches."


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def direct(engine: AsyncEngine, n: int, max_tokens: int) -> list[float]:
    """Sequential latencies calling the engine in-process (it runs on the gateway's loop)."""
    ids = engine.tokenizer.encode(
        engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}]),
        add_special_tokens=False,
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    await engine.start()
    out = []
    for i in range(n):
        t = time.perf_counter()
        async for _ in engine.submit(ids, params, request_id=f"d{i}", cache_domain="t:bench"):
            pass
        out.append(time.perf_counter() - t)
    await engine.shutdown()
    return out


def via_gateway(base: str, key: str, n: int, max_tokens: int) -> list[float]:
    """Sequential latencies through HTTP."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    out = []
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(base + "/v1/chat/completions", json=body)
            r.raise_for_status()
            out.append(time.perf_counter() - t)
    return out


async def throughput(base: str, key: str, seconds: float, concurrency: int) -> float:
    """Completed requests/s with `concurrency` clients looping for `seconds`."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}
    done = 0
    end = time.perf_counter() + seconds
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                r = await c.post(base + "/v1/chat/completions", json=body)
                if r.status_code == 200:
                    done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / seconds


def main() -> None:
    """Runs both sides and prints the figures."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cloister-bench-"))
    folder = make_tiny_model_dir(tmp)

    def new_engine() -> AsyncEngine:
        return AsyncEngine.from_options(
            model=str(folder), max_model_len=512, num_blocks=512, attention_backend="torch"
        )

    direct_lat = asyncio.run(direct(new_engine(), args.requests, args.max_tokens))
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"cloister:bench:{secrets.token_hex(4)}:"
    try:
        client = redis.Redis.from_url(url, socket_timeout=0.5)
        client.ping()
        limiter: object = RedisLimiter(
            client, fail_mode="closed", local_cap_rpm=600, key_prefix=prefix
        )
        backend = "redis"
    except redis.RedisError:
        limiter, backend = MemoryLimiter(), "memory (Redis unreachable)"
    (tmp / "gw").mkdir()
    gw, stop = start_gateway(tmp / "gw", engine=new_engine(), limiter=limiter, refresh_s=2.0)  # type: ignore[arg-type]
    try:
        key = gw.tenant("bench", rpm=10**6, tpm=10**9, max_concurrent=1000)
        via_gateway(gw.base_url, key, 3, args.max_tokens)  # warm-up
        gw_lat = via_gateway(gw.base_url, key, args.requests, args.max_tokens)
        rps = asyncio.run(throughput(gw.base_url, key, args.seconds, args.concurrency))
    finally:
        stop()
        if backend == "redis":
            for k in client.scan_iter(match=prefix + "*"):
                client.delete(k)
    result = {
        "limiter": backend,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "direct_p50_ms": round(statistics.median(direct_lat) * 1000, 2),
        "gateway_p50_ms": round(statistics.median(gw_lat) * 1000, 2),
        "added_p50_ms": round(
            (statistics.median(gw_lat) - statistics.median(direct_lat)) * 1000, 2
        ),
        "added_p99_ms": round((percentile(gw_lat, 0.99) - percentile(direct_lat, 0.99)) * 1000, 2),
        "max_rps": round(rps, 1),
        "concurrency": args.concurrency,
    }
    print(f"limiter: {backend}")
    print(f"direct  p50 {result['direct_p50_ms']} ms   gateway p50 {result['gateway_p50_ms']} ms")
    print(f"added   p50 {result['added_p50_ms']} ms   p99 {result['added_p99_ms']} ms")
    print(
        f"sustained through the gateway: {result['max_rps']} requests/s at concurrency {args.concurrency}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
