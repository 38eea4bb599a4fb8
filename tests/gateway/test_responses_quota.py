"""Stored /v1/responses cannot be flushed across tenants (issue 46, item 2).

A tenant once sent 30 requests whose `tool_choice` was 7 MB each (not in the prompt, so
not billed as tokens) and evicted every other tenant's stored responses: the memory
store's caps were store-wide, oldest first. Now every stored record is bounded (a 400
naming the field beyond `responses_max_record_bytes`), each tenant has a quota of stored
bytes (`responses_max_bytes_per_tenant`, entries per tenant too) past which only its own
oldest records go, a full memory store refuses new records rather than evict another
tenant's, and a response says `store: false` whenever it was not stored. Over HTTP, with
`cloister serve`'s wiring, on both stores (memory, and Redis at REDIS_URL); sizes are
scaled down from the report's 7 MB to keep the tests fast.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from assembly.app import build_app
from gateway.response_store_redis import RedisResponses
from tests.utils.built_app import close_app, fake_settings, migrated_sessions, tenant_keys
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.services import delete_prefix, redis_url

RECORD = 64_000  # responses_max_record_bytes
QUOTA = 150_000  # responses_max_bytes_per_tenant
PAD = 40_000  # the attacker's tool_choice padding: under RECORD, so each one is stored
TOOL = {
    "type": "function",
    "name": "f",
    "parameters": {"type": "object", "properties": {}},
}


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _serve(
    tmp: Path, tenants: tuple[str, ...], **options: Any
) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = fake_settings(tmp, tool_parser="hermes", **options)
    keys = tenant_keys(migrated_sessions(settings), tenants)
    app = build_app(settings, engine=gateway_test_engine(max_model_len=8192))
    try:
        with TestClient(app) as client:
            yield client, keys
    finally:
        close_app(app)


@pytest.fixture(scope="module", params=["memory", "redis"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """A serve-wired gateway on each store, with small record, quota and store-wide caps."""
    options: dict[str, Any] = dict(
        responses_store=request.param,
        responses_max_record_bytes=RECORD,
        responses_max_bytes_per_tenant=QUOTA,
        responses_max_chars=400_000,  # the memory store's store-wide cap
        responses_max_per_tenant=50,
    )
    url, tag = None, secrets.token_hex(4)
    if request.param == "redis":
        url = redis_url()
        options.update(
            redis_url=url,
            redis_key_prefix=f"test:{tag}:lim:",
            responses_key_prefix=f"test:{tag}:resp:",
        )
    tmp = tmp_path_factory.mktemp(f"responses_quota_{request.param}")
    try:
        yield from _serve(tmp, ("victim", "attacker", "third"), **options)
    finally:
        if url is not None:
            delete_prefix(redis.Redis.from_url(url), f"test:{tag}:")


def _create(client: TestClient, key: str, **body: Any) -> Any:
    body = {"model": "fake", "input": "hi", "max_output_tokens": 3, **body}
    return client.post("/v1/responses", json=body, headers=_auth(key))


def _padded(pad: int) -> dict[str, Any]:
    """A request whose `tool_choice` carries `pad` characters the prompt never sees."""
    return {"tools": [TOOL], "tool_choice": {"type": "function", "name": "f", "pad": "x" * pad}}


def _status(client: TestClient, key: str, response_id: str) -> int:
    return client.get(f"/v1/responses/{response_id}", headers=_auth(key)).status_code


def test_a_flood_of_huge_tool_choices_leaves_other_tenants_responses(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, keys = served
    kept = _create(client, keys["victim"])
    assert kept.status_code == 200 and kept.json()["store"] is True
    ids = []
    for _ in range(30):
        r = _create(client, keys["attacker"], **_padded(PAD))
        assert r.status_code == 200, r.text
        assert r.json()["store"] is True
        ids.append(r.json()["id"])
        assert _status(client, keys["attacker"], ids[-1]) == 200  # stored means stored
    assert _status(client, keys["victim"], kept.json()["id"]) == 200
    got = client.get(f"/v1/responses/{kept.json()['id']}", headers=_auth(keys["victim"]))
    assert got.json() == kept.json()
    # The attacker's quota holds at most QUOTA // PAD of its records: its oldest went.
    statuses = [_status(client, keys["attacker"], i) for i in ids]
    assert statuses[-1] == 200 and statuses[0] == 404
    assert statuses.count(200) <= QUOTA // PAD
    assert statuses == sorted(statuses, reverse=True)  # newest kept, oldest evicted


def test_a_record_over_the_bound_is_a_400_naming_the_field(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, keys = served
    huge = _create(client, keys["attacker"], **_padded(7 * 1024 * 1024))  # the report's 7 MB
    assert huge.status_code == 400, huge.text
    error = huge.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "tool_choice"
    assert error["code"] == "stored_response_too_large"
    assert str(RECORD) in error["message"]
    instructions = _create(client, keys["attacker"], instructions="y" * RECORD)
    assert instructions.status_code == 400
    assert instructions.json()["error"]["param"] == "instructions"
    # Not stored, no bound: store=false takes the same request.
    loose = _create(client, keys["attacker"], store=False, **_padded(RECORD))
    assert loose.status_code == 200 and loose.json()["store"] is False
    assert _status(client, keys["attacker"], loose.json()["id"]) == 404


def test_quota_eviction_touches_only_the_tenants_own_records(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, keys = served
    third = [_create(client, keys["third"]).json()["id"] for _ in range(3)]
    victim = _create(client, keys["victim"], **_padded(PAD)).json()["id"]
    mine = [_create(client, keys["attacker"], **_padded(PAD)).json()["id"] for _ in range(8)]
    assert [_status(client, keys["third"], i) for i in third] == [200] * 3
    assert _status(client, keys["victim"], victim) == 200
    held = [_status(client, keys["attacker"], i) for i in mine]
    assert held[:4] == [404] * 4 and held[-1] == 200


def test_a_full_memory_store_refuses_rather_than_evicts_others(tmp_path: Path) -> None:
    options: dict[str, Any] = dict(
        responses_store="memory",
        responses_max_record_bytes=30_000,
        responses_max_bytes_per_tenant=60_000,
        responses_max_chars=100_000,
    )
    for client, keys in _serve(tmp_path, ("a", "b", "c"), **options):
        held = {
            name: [_create(client, keys[name], **_padded(20_000)).json() for _ in range(2)]
            for name in ("a", "b")
        }
        assert all(r["store"] is True for rs in held.values() for r in rs)
        late = _create(client, keys["c"], **_padded(20_000))
        assert late.status_code == 200
        assert late.json()["store"] is False  # never `true` for what was not stored
        assert _status(client, keys["c"], late.json()["id"]) == 404
        for name, rs in held.items():
            assert [_status(client, keys[name], r["id"]) for r in rs] == [200, 200]
        # A tenant with records of its own makes room among them, not among others'.
        again = _create(client, keys["a"], **_padded(20_000))
        assert again.json()["store"] is True
        assert _status(client, keys["a"], held["a"][0]["id"]) == 404
        assert [_status(client, keys["b"], r["id"]) for r in held["b"]] == [200, 200]


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_its_output_makes_too_large_says_store_false(
    served: tuple[TestClient, dict[str, str]], stream: bool
) -> None:
    client, keys = served
    over = _create(client, keys["third"], **_padded(RECORD))
    found = re.search(r"would be (\d+)", over.json()["error"]["message"])
    assert found is not None
    pad = RECORD - (int(found[1]) - RECORD) - 10  # 10 bytes under the bound before output
    body = {"model": "fake", "input": "hi", "max_output_tokens": 50, "stream": stream}
    r = client.post("/v1/responses", json={**body, **_padded(pad)}, headers=_auth(keys["third"]))
    assert r.status_code == 200, r.text[:300]
    final = r.json() if not stream else _last_event(r.text)["response"]
    assert final["store"] is False and final["output"]  # answered, just not stored
    assert _status(client, keys["third"], final["id"]) == 404


def _last_event(text: str) -> Any:
    event = json.loads([ln for ln in text.splitlines() if ln.startswith("data: ")][-1][6:])
    assert event["type"] in ("response.completed", "response.incomplete")
    return event


@pytest.mark.parametrize("stream", [False, True])
def test_store_true_never_answers_a_response_that_was_not_stored(
    served: tuple[TestClient, dict[str, str]], stream: bool
) -> None:
    client, keys = served
    state = client.app.state.cloister  # type: ignore[attr-defined]
    dead = RedisResponses.from_url(
        "redis://127.0.0.1:9/0",
        ttl_s=60.0,
        max_per_tenant=10,
        max_record_bytes=RECORD,
        max_bytes_per_tenant=QUOTA,
    )
    client.app.state.cloister = dataclasses.replace(state, responses=dead)  # type: ignore[attr-defined]
    try:
        body = {"model": "fake", "input": "hi", "max_output_tokens": 3, "stream": stream}
        r = client.post("/v1/responses", json=body, headers=_auth(keys["victim"]))
        assert r.status_code == 200
        if stream:
            assert _last_event(r.text)["response"]["store"] is False
        else:
            assert r.json()["store"] is False
    finally:
        client.app.state.cloister = state  # type: ignore[attr-defined]
