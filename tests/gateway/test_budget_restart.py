"""An exhausted token budget stays exhausted when Redis loses its keys (issue 13, defect 10):
the usage ledger is the source of truth. The in-memory limiter's process restart is
checked by tests/gateway/test_crash_durability.py (kill -9, then restart)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from admin.models import UsageRow
from tests.gateway.processes import GatewayProcess, create_tenant_key, database, running_gateway
from tests.utils.services import delete_prefix, redis_url
from tests.utils.tiny_model import make_tiny_model_dir

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
BUDGET = 200


def _chat(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(
        gw.base_url + "/v1/chat/completions",
        json=BODY,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def exhaust(gw: GatewayProcess, key: str) -> int:
    """Spends the budget until the gateway says insufficient_quota; returns requests made."""
    for made in range(1, 100):
        r = _chat(gw, key)
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "insufficient_quota", r.text
            return made
        assert r.status_code == 200, r.text
    raise AssertionError("the budget never ran out")


def still_refused(gw: GatewayProcess, key: str) -> None:
    codes = []
    for _ in range(3):
        r = _chat(gw, key)
        codes.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "insufficient_quota", r.text
    assert codes == [429, 429, 429], codes


def _wait_metered(sessions: sessionmaker[Session], count: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with sessions() as s:
            if s.scalar(sa.select(sa.func.count()).select_from(UsageRow)) == count:
                return
        time.sleep(0.05)
    raise AssertionError("usage records did not reach the database")


@pytest.mark.slow
@pytest.mark.services
def test_budget_survives_redis_losing_its_keys(tmp_path: Path) -> None:
    url = redis_url()
    prefix = f"cloister:test:{secrets.token_hex(4)}:"
    data = tmp_path / "data"
    sessions = database(data)
    key = create_tenant_key(sessions, "acme", token_budget=BUDGET, budget_period="day")
    model = make_tiny_model_dir(tmp_path)
    client = redis.Redis.from_url(url)
    try:
        with running_gateway(
            data, model, tmp_path / "gw.log", redis_url=url, redis_key_prefix=prefix
        ) as gw:
            made = exhaust(gw, key)
            _wait_metered(sessions, made)
            delete_prefix(client, prefix)
            assert not list(client.scan_iter(match=prefix + "*"))  # Redis "restarted" empty
            still_refused(gw, key)
    finally:
        delete_prefix(client, prefix)
        client.close()
