"""Paths and methods the API does not have get OpenAI's error body too."""

from __future__ import annotations

from pathlib import Path

import httpx

from tenancy.limiter.memory import MemoryLimiter
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import start_gateway


def test_unknown_path_and_wrong_method_get_openai_errors(tmp_path: Path) -> None:
    gw, stop = start_gateway(tmp_path, engine=gateway_test_engine(), limiter=MemoryLimiter())
    try:
        key = gw.tenant("acme")
        headers = {"Authorization": f"Bearer {key}"}
        missing = httpx.get(gw.base_url + "/v1/nope", headers=headers, timeout=30)
        wrong = httpx.get(gw.base_url + "/v1/chat/completions", headers=headers, timeout=30)
        health = httpx.get(gw.base_url + "/health", timeout=30)
    finally:
        stop()
    assert missing.status_code == 404
    assert wrong.status_code == 405
    for r in (missing, wrong):
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    assert health.json() == {"status": "ok"}
