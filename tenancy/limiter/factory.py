"""Choose the limiter from settings: Redis when a URL is given, else in-memory."""

from __future__ import annotations

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenancy.limiter.base import BudgetLedger, FailMode, Limiter
from tenancy.limiter.memory import MemoryLimiter
from tenancy.limiter.redis_limiter import RedisLimiter

# A short socket timeout: a hung Redis must turn into the fail mode, not a hung request.
REDIS_TIMEOUT_S = 0.5
# Enough connections for a few hundred requests in flight (a script takes well under a
# millisecond); past that a burst queues for a free connection instead of failing.
REDIS_MAX_CONNECTIONS = 32
# How long a request may queue for a connection before it counts as a backend failure.
REDIS_POOL_TIMEOUT_S = 1.0


def make_redis_client(
    redis_url: str,
    *,
    max_connections: int = REDIS_MAX_CONNECTIONS,
    pool_timeout_s: float = REDIS_POOL_TIMEOUT_S,
) -> redis.asyncio.Redis:
    """A `redis.asyncio` client on a bounded, blocking pool it owns (closed with the client).

    Replies are parsed by hiredis when it is installed (redis-py picks it itself).
    Connecting is lazy, and the client binds to the event loop that first uses it.
    """
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        redis_url,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        # One immediate retry on a dropped connection (a pooled socket that Redis
        # closed when it restarted: the script never reached it), none on a timeout:
        # a timed-out script may well have run, and running it twice consumes twice.
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )
    return redis.asyncio.Redis.from_pool(pool)


def make_limiter(
    redis_url: str | None,
    *,
    fail_mode: FailMode = "open",
    local_cap_rpm: int = 600,
    key_prefix: str = "cloister:lim:",
    budget_ledger: BudgetLedger | None = None,
) -> Limiter:
    """An in-memory limiter when `redis_url` is None, else a Redis limiter (lazy connect).

    `budget_ledger` seeds cold budget counters from the usage ledger (see limiter.base).
    """
    if not redis_url:
        return MemoryLimiter(ledger=budget_ledger)
    return RedisLimiter(
        make_redis_client(redis_url),
        fail_mode=fail_mode,
        local_cap_rpm=local_cap_rpm,
        key_prefix=key_prefix,
        ledger=budget_ledger,
    )
