"""Gateway replicas as real processes on real Redis: exact limits across them, and Redis dying.

Both need a Redis server: they skip with the reason when none is reachable, and
fail instead under CLOISTER_REQUIRE_SERVICES=1 (see tests/utils/services.py).
"""

from __future__ import annotations

import contextlib
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import text

from tests.gateway.engine_servers import SERVICE_TOKEN, engine_servers
from tests.gateway.processes import GatewayProcess, create_tenant_key, database, gateways
from tests.utils.openai_http import post_json
from tests.utils.services import delete_prefix, private_redis_server, redis_url
from tests.utils.tiny_model import make_tiny_model_dir

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
pytestmark = pytest.mark.services


def chat(gw: GatewayProcess, key: str) -> httpx.Response:
    """One small chat completion."""
    return post_json(gw.base_url, "/v1/chat/completions", key, BODY)


def backend_errors(gw: GatewayProcess) -> float:
    """The gateway's cloister_limiter_backend_errors_total."""
    text = httpx.get(gw.base_url + "/metrics", timeout=10).text
    match = re.search(r"^cloister_limiter_backend_errors_total (\S+)$", text, re.M)
    assert match is not None, text
    return float(match.group(1))


def warm_up(gw: GatewayProcess, key: str) -> None:
    """Loads the key into the gateway's cache without consuming any limit."""
    r = httpx.get(gw.base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("split", [False, True], ids=["in-process", "engine-servers"])
def test_two_gateways_admit_exactly_the_limit(tmp_path: Path, split: bool) -> None:
    """Two gateway replicas on one Redis admit L-1..L of a burst; with the split
    deployment (both over the same engine server) too, and each admitted request has
    exactly one usage record."""
    url = redis_url()
    prefix = f"cloister:test:{secrets.token_hex(4)}:"
    limit = 8  # rpm: the bucket refills one request per 7.5 s, far longer than the burst
    data = tmp_path / "data"
    sessions = database(data)
    key = create_tenant_key(sessions, "acme", rpm=limit)
    model = make_tiny_model_dir(tmp_path)
    try:
        with contextlib.ExitStack() as stack:
            config: dict[str, object] = {"redis_url": url, "redis_key_prefix": prefix}
            if split:
                (engine,) = stack.enter_context(engine_servers(model, tmp_path / "engine", 1))
                config |= {"engine_urls": engine.base_url, "service_token": SERVICE_TOKEN}
            # One usage spool per replica, as each pod has its own (they share the database).
            configs = [
                {**config, "admin_spool_path": tmp_path / f"spool-{i}.jsonl"} for i in (0, 1)
            ]
            gws = stack.enter_context(gateways(data, model, tmp_path / "logs", configs))
            for gw in gws:
                warm_up(gw, key)
            targets = [gws[i % 2] for i in range(3 * limit)]
            with ThreadPoolExecutor(max_workers=len(targets)) as pool:
                responses = list(pool.map(lambda gw: chat(gw, key), targets))
            logs = "".join(gw.logs() for gw in gws)
    finally:
        delete_prefix(redis.Redis.from_url(url), prefix)
    ids = [r.json()["id"] for r in responses if r.status_code == 200]
    with sessions() as s:  # the gateways flushed their usage at shutdown
        rows = s.execute(text("SELECT request_id, status FROM usage_records")).all()
    served = sorted(request_id for request_id, status in rows if status == 200)
    assert served == sorted(ids)  # one record per admitted request, none lost, none extra
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    admitted = codes.count(200)
    assert limit - 1 <= admitted <= limit, codes
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.headers["x-ratelimit-limit-requests"] == str(limit)
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
    # Both replicas took part: each admitted or refused some of the burst.
    by_gateway = {gw.base_url for gw in targets}
    assert len(by_gateway) == 2
    assert key not in logs


def test_redis_stopped_mid_test_applies_the_fail_mode(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sessions = database(data)
    key = create_tenant_key(sessions, "acme")  # no limits: only the local cap applies
    model = make_tiny_model_dir(tmp_path)
    local_cap = 3
    with private_redis_server() as (url, server):
        configs = [
            {"redis_url": url, "limiter_fail_mode": "open", "limiter_local_cap_rpm": local_cap},
            {"redis_url": url, "limiter_fail_mode": "closed"},
        ]
        with gateways(data, model, tmp_path / "logs", configs) as (fail_open, fail_closed):
            for gw in (fail_open, fail_closed):
                assert chat(gw, key).status_code == 200  # Redis up: the shared limiter admits
                assert backend_errors(gw) == 0
            server.terminate()
            server.wait(timeout=10)

            open_codes = [chat(fail_open, key).status_code for _ in range(local_cap + 2)]
            assert open_codes == [200] * local_cap + [429, 429], open_codes
            assert backend_errors(fail_open) >= local_cap + 2

            for _ in range(3):
                r = chat(fail_closed, key)
                assert r.status_code == 503, r.text
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "limiter_unavailable"
            assert backend_errors(fail_closed) >= 3
            # The process keeps serving what does not need the limiter.
            assert httpx.get(fail_closed.base_url + "/health").status_code == 200
