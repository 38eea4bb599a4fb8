"""Exactness across OS processes, and behaviour when Redis goes away."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import subprocess
import time
from collections.abc import Callable

import pytest
import redis
import redis.asyncio

from tenancy.errors import LimiterUnavailableError, RateLimitedError
from tenancy.limiter.factory import make_limiter
from tenancy.limiter.redis_limiter import RedisLimiter
from tests.utils.principals import make_principal
from tests.utils.services import private_redis_server

LIMIT = 20


def _hammer(url: str, prefix: str, calls: int, start_at: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One gateway process: `calls` concurrent acquires on its event loop at the same instant."""

    async def burst() -> int:
        limiter = RedisLimiter(
            redis.asyncio.Redis.from_url(url), fail_mode="closed", key_prefix=prefix
        )
        p = make_principal(rpm=LIMIT)
        await limiter.acquire(make_principal("warm-up"), prompt_tokens=0, max_tokens=0)
        while time.time() < start_at:
            await asyncio.sleep(0.001)

        async def one() -> int:
            try:
                await limiter.acquire(p, prompt_tokens=1, max_tokens=1)
                return 1
            except RateLimitedError:
                return 0

        try:
            return sum(await asyncio.gather(*(one() for _ in range(calls))))
        finally:
            await limiter.aclose()

    out.put(asyncio.run(burst()))


def test_two_processes_admit_at_most_the_limit(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 3.0  # spawn start-up is slow; meet at a shared instant
    procs = [
        ctx.Process(target=_hammer, args=(url, prefix, 3 * LIMIT // 2, start_at, out))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    admitted = sum(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    # 3L attempts at limit L: exactly L, or L-1 if a refill fraction lands late.
    assert LIMIT - 1 <= admitted <= LIMIT


def test_redis_stopped_fail_open_admits_within_local_cap() -> None:
    async def scenario(url: str, stop: Callable[[], None]) -> None:
        limiter = make_limiter(url, fail_mode="open", local_cap_rpm=3)
        assert isinstance(limiter, RedisLimiter)
        p = make_principal(rpm=100, token_budget=10)
        adm = await limiter.acquire(p, prompt_tokens=1, max_tokens=1)
        assert adm.backend == "redis"
        await limiter.release(adm, actual_tokens=1)
        stop()
        admitted = []
        for _ in range(3):
            admitted.append(await limiter.acquire(p, prompt_tokens=1, max_tokens=1))
        assert all(a.backend == "local" for a in admitted)
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1)
        assert err.value.reason == "requests"
        for a in admitted:
            await limiter.release(a, actual_tokens=2)  # no raw redis error either
        assert limiter.backend_errors == 4
        await limiter.aclose()

    with private_redis_server() as (url, proc):
        asyncio.run(scenario(url, lambda: _stop(proc)))


def test_redis_stopped_fail_closed_raises_unavailable() -> None:
    async def scenario(url: str, stop: Callable[[], None]) -> None:
        seen: list[Exception] = []
        limiter = RedisLimiter(
            redis.asyncio.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5),
            fail_mode="closed",
            on_backend_error=seen.append,
        )
        p = make_principal(rpm=10, max_concurrent=1)
        adm = await limiter.acquire(p, prompt_tokens=1, max_tokens=1)
        stop()
        with pytest.raises(LimiterUnavailableError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1)
        await limiter.release(adm, actual_tokens=1)  # swallowed and counted
        assert limiter.backend_errors == 2
        assert len(seen) == 2 and all(isinstance(e, redis.RedisError) for e in seen)
        await limiter.aclose()

    with private_redis_server() as (url, proc):
        asyncio.run(scenario(url, lambda: _stop(proc)))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)
