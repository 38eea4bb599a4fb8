"""The Redis limiter's connection pool: bursts queue for a connection, a restart is survived."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

from tenancy.errors import LimiterUnavailableError
from tenancy.limiter.factory import make_limiter, make_redis_client
from tenancy.limiter.redis_limiter import RedisLimiter
from tests.utils.principals import make_principal
from tests.utils.services import private_redis_server


def test_a_burst_beyond_the_pool_waits_for_a_connection(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix

    async def scenario() -> None:
        client = make_redis_client(url, max_connections=2, pool_timeout_s=5.0)
        limiter = RedisLimiter(client, fail_mode="closed", key_prefix=prefix)
        p = make_principal(rpm=1000, max_concurrent=1000)
        admissions = await asyncio.gather(
            *(limiter.acquire(p, prompt_tokens=1, max_tokens=1) for _ in range(50))
        )
        # A plain pool capped at 2 raises MaxConnectionsError (a backend failure, so
        # a 503 here); the blocking pool queues the burst instead.
        assert all(a.backend == "redis" for a in admissions)
        assert limiter.backend_errors == 0
        assert min(a.requests.remaining for a in admissions if a.requests) == 950
        await asyncio.gather(*(limiter.release(a, actual_tokens=1) for a in admissions))
        assert limiter.backend_errors == 0
        await limiter.aclose()

    asyncio.run(scenario())


def test_no_free_connection_in_time_is_a_backend_failure(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix

    async def scenario() -> None:
        client = make_redis_client(url, max_connections=1, pool_timeout_s=0.05)
        seen: list[Exception] = []
        closed = RedisLimiter(
            client, fail_mode="closed", key_prefix=prefix, on_backend_error=seen.append
        )
        opened = RedisLimiter(client, fail_mode="open", key_prefix=prefix)
        p = make_principal(rpm=10)
        # Hold the only connection, as a burst would.
        held = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        with pytest.raises(LimiterUnavailableError):
            await closed.acquire(p, prompt_tokens=1, max_tokens=1)
        assert closed.backend_errors == 1 and isinstance(seen[0], redis.ConnectionError)
        assert (await opened.acquire(p, prompt_tokens=1, max_tokens=1)).backend == "local"
        await client.connection_pool.release(held)
        assert (await closed.acquire(p, prompt_tokens=1, max_tokens=1)).backend == "redis"
        await closed.aclose()

    asyncio.run(scenario())


def test_a_restarted_redis_is_reconnected_without_a_failure() -> None:
    async def scenario(url: str, restart: Callable[[], None]) -> None:
        limiter = make_limiter(url, fail_mode="closed")
        assert isinstance(limiter, RedisLimiter)
        p = make_principal(rpm=10)
        assert (await limiter.acquire(p, prompt_tokens=1, max_tokens=1)).backend == "redis"
        restart()  # the pooled connection now points at a closed socket
        assert (await limiter.acquire(p, prompt_tokens=1, max_tokens=1)).backend == "redis"
        assert limiter.backend_errors == 0
        await limiter.aclose()

    with private_redis_server() as (url, proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with _restartable(proc, port) as restart:
            asyncio.run(scenario(url, restart))


@contextmanager
def _restartable(proc: subprocess.Popen[bytes], port: int) -> Iterator[Callable[[], None]]:
    """A function that stops `proc` and starts a fresh redis-server on `port`."""
    started: list[subprocess.Popen[bytes]] = []

    def restart() -> None:
        proc.terminate()
        proc.wait(timeout=10)
        binary = shutil.which("redis-server")
        assert binary is not None
        started.append(
            subprocess.Popen(
                [binary, "--port", str(port), "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=port, socket_connect_timeout=0.2) as probe:
                    probe.ping()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "redis-server did not restart"
                time.sleep(0.05)

    try:
        yield restart
    finally:
        for server in started:
            server.terminate()
            server.wait(timeout=10)
