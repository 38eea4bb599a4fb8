"""Stored `/v1/responses` in Redis, shared by every gateway replica on it.

With several gateways behind one Service, a client's next turn (previous_response_id),
GET or DELETE may land on another replica than the one that answered; in memory that
replica would answer 404. Here an entry is one key, `<prefix><tenant>:<id>`, with the
TTL as its expiry: the tenant is part of the key, so another tenant's lookup of the
same id reads exactly like an unknown id. Each tenant's ids sit in a sorted set by
store time, beside a hash of each entry's size (its serialized record's bytes, as in
memory). One script per put (atomic across replicas) forgets the tenant's entries past
the TTL, then evicts the tenant's OWN oldest entries until the new one fits its caps,
entries (`max_per_tenant`) and bytes (`max_bytes_per_tenant`), then stores it: one
tenant can never evict another's. An entry over `max_record_bytes` is not stored.

There is no store-wide cap: the per-tenant caps and the TTL bound the store (tenants x
`max_bytes_per_tenant`); size Redis's `maxmemory` for that. With `noeviction`, a full
Redis refuses the put (the response says `store: false`); an evicting policy lets Redis
itself drop any tenant's entries (a later 404), so do not use one for this store.

Reads that fail (Redis down) raise `ResponseStoreUnavailableError`, a 503; a put that
fails is logged and answers False (the response was already produced: it says
`store: false`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as redis_async
from redis.exceptions import RedisError

from gateway.errors import GatewayError
from gateway.response_store import StoredResponse, record_json

logger = logging.getLogger("cloister.gateway.responses")

# KEYS: the entry, the tenant's index (id -> store time, ms), its sizes (id -> bytes).
# ARGV: id, record, TTL (ms), max entries, max bytes, the tenant's entry key prefix.
# Returns how many of the tenant's own entries were evicted. Redis's clock stamps the
# entries, so every replica agrees on what has expired.
_PUT = """
local index, sizes = KEYS[2], KEYS[3]
local id, record, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local max_entries, max_bytes, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local size = string.len(record)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function forget(member)
  redis.call('ZREM', index, member)
  redis.call('HDEL', sizes, member)
  redis.call('DEL', prefix .. member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now - ttl)) do
  forget(member)
end
forget(id)
local count = redis.call('ZCARD', index)
local total = 0
for _, bytes in ipairs(redis.call('HVALS', sizes)) do total = total + tonumber(bytes) end
local evicted = 0
while count > 0 and (count + 1 > max_entries or total + size > max_bytes) do
  local oldest = redis.call('ZRANGE', index, 0, 0)[1]
  total = total - tonumber(redis.call('HGET', sizes, oldest) or '0')
  forget(oldest)
  count = count - 1
  evicted = evicted + 1
end
redis.call('SET', KEYS[1], record, 'PX', ttl)
redis.call('ZADD', index, now, id)
redis.call('HSET', sizes, id, size)
redis.call('PEXPIRE', index, ttl)
redis.call('PEXPIRE', sizes, ttl)
return evicted
"""


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
        max_record_bytes: int,
        max_bytes_per_tenant: int,
        key_prefix: str = "cloister:resp:",
    ) -> None:
        self._redis = client
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._max_per_tenant = max_per_tenant
        self._max_record_bytes = max_record_bytes
        self._max_bytes_per_tenant = max_bytes_per_tenant
        self._prefix = key_prefix
        self._put = client.register_script(_PUT)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisResponses:
        """A store on the Redis at `url` (its own connection pool)."""
        return cls(redis_async.Redis.from_url(url, socket_timeout=5.0), **options)

    def _key(self, tenant_id: str, response_id: str) -> str:
        return f"{self._prefix}{tenant_id}:{response_id}"

    def _index(self, tenant_id: str) -> str:
        return f"{self._prefix}index:{tenant_id}"

    def _sizes(self, tenant_id: str) -> str:
        return f"{self._prefix}sizes:{tenant_id}"

    async def put(self, entry: StoredResponse) -> bool:
        """Stores `entry` with the TTL, evicting the tenant's own oldest entries past its
        caps; False when it was not stored (too large, or Redis failed: logged)."""
        record = record_json(entry.conversation, entry.body)
        if len(record) > min(self._max_record_bytes, self._max_bytes_per_tenant):
            return False
        tenant = entry.tenant_id
        try:
            await self._put(
                keys=[
                    self._key(tenant, entry.response_id),
                    self._index(tenant),
                    self._sizes(tenant),
                ],
                args=[
                    entry.response_id,
                    record,
                    self._ttl_ms,
                    self._max_per_tenant,
                    self._max_bytes_per_tenant,
                    self._key(tenant, ""),
                ],
            )
        except RedisError as exc:
            logger.warning(
                "response %s not stored: the response store is unavailable (%s)",
                entry.response_id,
                exc,
            )
            return False
        return True

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
                pipe.hdel(self._sizes(tenant_id), response_id)
                deleted, _, _ = await pipe.execute()
        except RedisError as exc:
            raise ResponseStoreUnavailableError(
                f"the response store is unavailable: {exc}", code="response_store_unavailable"
            ) from None
        return bool(deleted)

    async def close(self) -> None:
        """Closes the connection pool."""
        await self._redis.aclose()
