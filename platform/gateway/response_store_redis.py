"""Stored `/v1/responses` in Redis, shared by every gateway replica on it.

With several gateways behind one Service, a client's next turn (previous_response_id),
GET or DELETE may land on another replica than the one that answered; in memory that
replica would answer 404. Here an entry is one key, `<prefix><tenant>:<id>`, with the
TTL as its expiry: the tenant is part of the key, so another tenant's lookup of the
same id reads exactly like an unknown id. Each tenant's ids sit in a sorted set by
store time, trimmed oldest-first to `max_per_tenant` after each put (so one tenant
cannot crowd out the rest), and an entry over `max_chars` is not stored, as in memory.
There is no store-wide entry cap: the per-tenant cap and the TTL bound it, and
Redis's own `maxmemory` policy is the operator's last word.

Reads that fail (Redis down) raise `ResponseStoreUnavailableError`, a 503; a put that
fails is logged and dropped, since the response it stores was already produced.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis.asyncio as redis_async
from redis.exceptions import RedisError

from gateway.errors import GatewayError
from gateway.response_store import StoredResponse

logger = logging.getLogger("cloister.gateway.responses")


class ResponseStoreUnavailableError(GatewayError):
    """The shared response store cannot be read (a 503 in OpenAI's error format)."""

    status = 503
    type = "service_unavailable"


class RedisResponses:
    """A `ResponseRepository` in Redis, shared by the gateways that use the same prefix."""

    def __init__(
        self,
        client: redis_async.Redis,
        *,
        ttl_s: float,
        max_per_tenant: int,
        max_chars: int,
        key_prefix: str = "cloister:resp:",
    ) -> None:
        self._redis = client
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._max_per_tenant = max_per_tenant
        self._max_chars = max_chars
        self._prefix = key_prefix

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisResponses:
        """A store on the Redis at `url` (its own connection pool)."""
        return cls(redis_async.Redis.from_url(url, socket_timeout=5.0), **options)

    def _key(self, tenant_id: str, response_id: str) -> str:
        return f"{self._prefix}{tenant_id}:{response_id}"

    def _index(self, tenant_id: str) -> str:
        return f"{self._prefix}index:{tenant_id}"

    async def put(self, entry: StoredResponse) -> None:
        """Stores `entry` with the TTL; trims the tenant's oldest entries past the cap."""
        if entry.chars > self._max_chars:
            return
        value = json.dumps({"conversation": list(entry.conversation), "body": entry.body})
        index = self._index(entry.tenant_id)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._key(entry.tenant_id, entry.response_id), value, px=self._ttl_ms)
                pipe.zadd(index, {entry.response_id: time.time()})
                pipe.pexpire(index, self._ttl_ms)
                pipe.zcard(index)
                results = await pipe.execute()
            excess = int(results[-1]) - self._max_per_tenant
            if excess > 0:
                oldest = await self._redis.zpopmin(index, excess)
                ids = [_text(pair[0]) for pair in oldest if isinstance(pair, (tuple, list))]
                if ids:
                    await self._redis.delete(*(self._key(entry.tenant_id, i) for i in ids))
        except RedisError as exc:
            logger.warning(
                "response %s not stored: the response store is unavailable (%s)",
                entry.response_id,
                exc,
            )

    async def get(self, tenant_id: str, response_id: str) -> StoredResponse | None:
        """The tenant's live entry; None if unknown, expired, trimmed or another's."""
        try:
            raw = await self._redis.get(self._key(tenant_id, response_id))
        except RedisError as exc:
            raise ResponseStoreUnavailableError(
                f"the response store is unavailable: {exc}", code="response_store_unavailable"
            ) from None
        if raw is None:
            return None
        data = json.loads(raw)
        return StoredResponse(
            response_id=response_id,
            tenant_id=tenant_id,
            conversation=tuple(data["conversation"]),
            body=str(data["body"]),
        )

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        """Removes the tenant's entry; False when there was none."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self._key(tenant_id, response_id))
                pipe.zrem(self._index(tenant_id), response_id)
                deleted, _ = await pipe.execute()
        except RedisError as exc:
            raise ResponseStoreUnavailableError(
                f"the response store is unavailable: {exc}", code="response_store_unavailable"
            ) from None
        return bool(deleted)

    async def close(self) -> None:
        """Closes the connection pool."""
        await self._redis.aclose()


def _text(member: Any) -> str:
    return member.decode() if isinstance(member, bytes) else str(member)
