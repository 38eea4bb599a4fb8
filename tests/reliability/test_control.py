"""The suite's control: ordinary traffic from another tenant leaves the bystanders' streams
exactly as they were on a quiet server (so a changed stream in an attack means harm)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.reliability.live import problems, send
from tests.utils.hostile_server import LiveServer


def test_ordinary_load_leaves_bystanders_unchanged(live_server: LiveServer) -> None:
    bodies = [
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Say something about the number {i}."}],
            "max_tokens": 8 + i % 5,
            "temperature": 1.0 if i % 2 else 0,
            "stream": bool(i % 3),
        }
        for i in range(12)
    ]
    with (
        live_server.bystanders.running(),
        httpx.Client(base_url=live_server.base_url, timeout=120) as client,
        ThreadPoolExecutor(max_workers=3) as pool,
    ):
        replies = list(
            pool.map(
                lambda body: send(
                    client,
                    "POST",
                    "/v1/chat/completions",
                    token=live_server.attacker_key,
                    json_body=body,
                    what="ordinary chat",
                ),
                bodies,
            )
        )
    assert [r.status for r in replies] == [200] * len(bodies), [
        p for r in replies for p in problems(r)
    ]
    assert live_server.bystanders.failures() == []
