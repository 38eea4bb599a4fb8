"""/v1/responses through `cloister serve`'s wiring (build_app) on the fast fake engine: the store's
TTL and caps come from the settings, denials reach the audit log, and an engine failure
mid-stream is an in-band `error` event with a failed usage record."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from assembly.app import build_app
from engine.fronts.async_engine import AsyncEngine
from tenancy import store
from tests.utils.built_app import (
    admin_secret,
    close_app,
    fake_settings,
    migrated_sessions,
    tenant_keys,
)
from tests.utils.engine_faults import fail_after
from tests.utils.fast_fake_model import gateway_test_engine

TTL_S = 0.5


def _serve(tmp_path: Path, engine: AsyncEngine) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = fake_settings(tmp_path, responses_ttl_s=TTL_S, responses_max_per_tenant=2)
    sessions = migrated_sessions(settings)
    keys = tenant_keys(sessions, ("acme", "narrow"))
    with sessions() as s:
        store.set_limits(s, tenant_name="narrow", allowed_models=["other"])
    keys["admin"] = admin_secret(sessions)
    app = build_app(settings, engine=engine)
    with TestClient(app) as client:
        yield client, keys
    close_app(app)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """One serve-wired app on the fast fake engine for the module."""
    yield from _serve(tmp_path_factory.mktemp("responses_wiring"), gateway_test_engine())


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _create(client: TestClient, key: str, **body: Any) -> Any:
    body = {"model": "fake", "input": "hi", "max_output_tokens": 3, **body}
    return client.post("/v1/responses", json=body, headers=_auth(key))


def test_a_stored_response_expires_after_the_ttl(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, keys = served
    first = _create(client, keys["acme"]).json()
    assert _create(client, keys["acme"], previous_response_id=first["id"]).status_code == 200
    time.sleep(TTL_S + 0.1)
    late = _create(client, keys["acme"], previous_response_id=first["id"])
    assert late.status_code == 404
    assert late.json()["error"]["code"] == "previous_response_not_found"
    got = client.get(f"/v1/responses/{first['id']}", headers=_auth(keys["acme"]))
    assert got.status_code == 404


def test_a_tenant_keeps_only_its_newest_responses(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, keys = served
    ids = [_create(client, keys["acme"]).json()["id"] for _ in range(3)]
    statuses = [
        client.get(f"/v1/responses/{i}", headers=_auth(keys["acme"])).status_code for i in ids
    ]
    assert statuses == [404, 200, 200]
    assert client.get(f"/v1/responses/{ids[-1]}").status_code == 401  # no key, no read


def test_denials_are_audited_like_chats(served: tuple[TestClient, dict[str, str]]) -> None:
    client, keys = served
    assert [_create(client, keys["narrow"]).status_code for _ in range(3)] == [403] * 3
    bad = _auth("sk-clo-" + "x" * 43)
    assert client.get("/v1/responses/resp_x", headers=bad).status_code == 401
    assert client.post("/v1/responses", json={}, headers=bad).status_code == 401
    r = client.get("/admin/api/v1/audit", params={"limit": 500}, headers=_auth(keys["admin"]))
    assert r.status_code == 200
    events = {e["outcome"]: e for e in r.json()["items"] if e["resource"] in ("gateway", "fake")}
    model = events["denied:403"]
    assert model["action"] == "access.denied" and model["resource"] == "fake"
    assert model["detail"]["reasons"] == {"model": 3} and model["actor"].startswith("key:")
    assert events["denied:401"]["detail"]["reasons"]["invalid"] == 2


def test_an_engine_failure_mid_stream_is_an_error_event(tmp_path: Path) -> None:
    engine = gateway_test_engine()
    fail_after(engine, 2, lambda: RuntimeError("CUDA error: an illegal memory access"))
    for client, keys in _serve(tmp_path, engine):
        body = {"model": "fake", "input": "hi", "max_output_tokens": 20, "stream": True}
        with client.stream("POST", "/v1/responses", json=body, headers=_auth(keys["acme"])) as r:
            assert r.status_code == 200
            raw = r.read().decode()
        payloads = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
        types = [p["type"] for p in payloads]
        assert types[-1] == "error" and "response.completed" not in types
        assert payloads[-1]["code"] == "engine_error"
        assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
        response_id = payloads[0]["response"]["id"]
        # A failed response is not stored.
        got = client.get(f"/v1/responses/{response_id}", headers=_auth(keys["acme"]))
        assert got.status_code == 404
