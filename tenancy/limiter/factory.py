"""Choose the limiter from settings: Redis when a URL is given, else in-memory."""

from __future__ import annotations

import redis

from tenancy.limiter.base import FailMode, Limiter
from tenancy.limiter.memory import MemoryLimiter
from tenancy.limiter.redis_limiter import RedisLimiter

# A short socket timeout: a hung Redis must turn into the fail mode, not a hung request.
REDIS_TIMEOUT_S = 0.5


def make_limiter(
    redis_url: str | None,
    *,
    fail_mode: FailMode = "open",
    local_cap_rpm: int = 600,
    key_prefix: str = "cloister:lim:",
) -> Limiter:
    """An in-memory limiter when `redis_url` is None, else a Redis limiter (lazy connect)."""
    if not redis_url:
        return MemoryLimiter()
    client = redis.Redis.from_url(
        redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )
    return RedisLimiter(
        client, fail_mode=fail_mode, local_cap_rpm=local_cap_rpm, key_prefix=key_prefix
    )
