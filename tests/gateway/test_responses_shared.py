"""Stored /v1/responses shared by two gateway replicas on one Redis.

Two `cloister serve`-wired apps (build_app) on one data folder and one Redis, as two
gateway pods behind one Service: a response stored through one is read, continued and
deleted through the other, still scoped to its tenant, with the TTL and the
per-tenant cap applied in Redis. In memory, the second replica answered 404.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import ValidationError

from assembly.app import build_app
from gateway.response_store import StoredResponse
from gateway.response_store_redis import RedisResponses, ResponseStoreUnavailableError
from server.settings import Settings
from tests.utils.built_app import close_app, migrated_sessions, tenant_keys
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER
from tests.utils.services import delete_prefix, redis_url

TTL_S = 1.5


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TestClient, TestClient, dict[str, str]]]:
    """Two gateways on one data folder and one Redis (their own key prefixes)."""
    url = redis_url()
    tag = secrets.token_hex(4)
    data = tmp_path_factory.mktemp("responses_shared")
    common: dict[str, Any] = dict(
        data_dir=data,
        key_pepper=PEPPER,
        model_name="fake",
        config_refresh_s=0.0,
        auth_failure_limit=0,
        redis_url=url,
        redis_key_prefix=f"test:{tag}:lim:",
        responses_key_prefix=f"test:{tag}:resp:",
        responses_ttl_s=TTL_S,
        responses_max_per_tenant=2,
    )
    first, second = Settings(**common), Settings(**common)
    keys = tenant_keys(migrated_sessions(first), ("acme", "other"))
    apps = [
        build_app(first, engine=gateway_test_engine()),
        build_app(second, engine=gateway_test_engine()),
    ]
    try:
        with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
            yield a, b, keys
    finally:
        for app in apps:
            close_app(app)
        delete_prefix(redis.Redis.from_url(url), f"test:{tag}:")


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _create(client: TestClient, key: str, **body: Any) -> Any:
    body = {"model": "fake", "input": "hi", "max_output_tokens": 3, **body}
    response = client.post("/v1/responses", json=body, headers=_auth(key))
    assert response.status_code == 200, response.text
    return response.json()


def test_a_response_stored_on_one_replica_is_read_and_continued_on_the_other(
    replicas: tuple[TestClient, TestClient, dict[str, str]],
) -> None:
    a, b, keys = replicas
    first = _create(a, keys["acme"])
    got = b.get(f"/v1/responses/{first['id']}", headers=_auth(keys["acme"]))
    assert got.status_code == 200 and got.json() == first
    follow = _create(b, keys["acme"], previous_response_id=first["id"])
    assert follow["id"] != first["id"]
    # Another tenant's lookup of the same id is an unknown id, on either replica.
    for client in (a, b):
        denied = client.get(f"/v1/responses/{first['id']}", headers=_auth(keys["other"]))
        assert denied.status_code == 404
        assert denied.json()["error"]["code"] == "response_not_found"
    deleted = b.delete(f"/v1/responses/{first['id']}", headers=_auth(keys["acme"]))
    assert deleted.status_code == 200
    assert a.get(f"/v1/responses/{first['id']}", headers=_auth(keys["acme"])).status_code == 404


def test_the_per_tenant_cap_and_the_ttl_apply_across_replicas(
    replicas: tuple[TestClient, TestClient, dict[str, str]],
) -> None:
    a, b, keys = replicas
    ids = [_create(client, keys["other"])["id"] for client in (a, b, a)]
    statuses = [b.get(f"/v1/responses/{i}", headers=_auth(keys["other"])).status_code for i in ids]
    assert statuses == [404, 200, 200]  # max_per_tenant=2: the oldest is trimmed
    time.sleep(TTL_S + 0.2)
    late = a.post(
        "/v1/responses",
        json={"model": "fake", "input": "hi", "previous_response_id": ids[-1]},
        headers=_auth(keys["other"]),
    )
    assert late.status_code == 404
    assert late.json()["error"]["code"] == "previous_response_not_found"


def test_an_unreachable_store_is_a_503_on_reads_and_never_fails_a_put() -> None:
    dead = RedisResponses.from_url(
        "redis://127.0.0.1:9/0",
        ttl_s=60.0,
        max_per_tenant=10,
        max_record_bytes=10_000,
        max_bytes_per_tenant=10_000,
    )
    entry = StoredResponse("resp_1", "t1", ({"role": "user", "content": "hi"},), "{}")

    async def run() -> None:
        # Logged, not raised (the response was already produced); False: `store: false`.
        assert await dead.put(entry) is False
        with pytest.raises(ResponseStoreUnavailableError) as raised:
            await dead.get("t1", "resp_1")
        assert raised.value.status == 503
        await dead.close()

    asyncio.run(run())


def test_a_redis_store_without_redis_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="responses_store=redis needs redis_url"):
        Settings(data_dir=tmp_path, key_pepper=PEPPER, responses_store="redis")


def test_the_redis_quota_evicts_only_the_tenants_own_and_forgets_what_expired() -> None:
    url, tag = redis_url(), secrets.token_hex(4)
    prefix = f"test:{tag}:resp:"
    size = StoredResponse("r", "a", ({"role": "user", "content": "x" * 10},), "{}").size
    store = RedisResponses.from_url(
        url,
        ttl_s=0.5,
        max_per_tenant=10,
        max_record_bytes=size,
        max_bytes_per_tenant=3 * size,
        key_prefix=prefix,
    )

    def entry(rid: str, tenant: str, n: int = 10) -> StoredResponse:
        return StoredResponse(rid, tenant, ({"role": "user", "content": "x" * n},), "{}")

    async def held(tenant: str, ids: list[str]) -> list[bool]:
        return [await store.get(tenant, i) is not None for i in ids]

    async def run() -> None:
        assert await store.put(entry("b0", "b"))
        ids = [f"a{i}" for i in range(5)]
        for i in ids:
            assert await store.put(entry(i, "a"))
        assert await held("a", ids) == [False, False, True, True, True]
        assert await held("b", ["b0"]) == [True]
        assert await store.put(entry("big", "a", 11)) is False  # over the record bound
        assert await store.delete("a", "a4")
        assert int(raw.hlen(f"{prefix}sizes:a")) == 2  # the deleted one's size went too
        time.sleep(0.6)  # every entry expired: none counts against the quota any more
        for i in ("c0", "c1", "c2"):
            assert await store.put(entry(i, "a"))
        assert await held("a", ["c0", "c1", "c2"]) == [True] * 3
        assert int(raw.hlen(f"{prefix}sizes:a")) == 3
        await store.close()

    raw = redis.Redis.from_url(url)
    try:
        asyncio.run(run())
    finally:
        delete_prefix(raw, f"test:{tag}:")
