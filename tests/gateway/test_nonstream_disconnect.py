"""A non-streamed request whose client hangs up is aborted at once: engine and concurrency
slot freed, partial usage recorded as a disconnect (issue 13, defect 8)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.usage import UsageRecord
from tenancy import store
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

MAX_TOKENS = 400  # 20 s at the fake model's 50 ms a step: far longer than the test waits


@pytest.fixture
def slow_gateway(tmp_path: Path) -> Iterator[tuple[LiveGateway, MemoryLimiter]]:
    limiter = MemoryLimiter()
    gw, stop = start_gateway(tmp_path, engine=gateway_test_engine(compute_s=0.05), limiter=limiter)
    yield gw, limiter
    stop()


def _send_and_hang_up(gw: LiveGateway, key: str, path: str, body: dict[str, object]) -> None:
    """Sends one request on a raw socket, waits while it generates, then closes the socket."""
    url = urlsplit(gw.base_url)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(head + data)
        deadline = time.monotonic() + 10
        while not gw.engine.stats().num_running and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # a few tokens generated


def _wait_record(gw: LiveGateway, timeout_s: float = 5.0) -> UsageRecord | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gw.usage.records:
            return gw.usage.records[0]
        time.sleep(0.02)
    return None


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
def test_client_gone_mid_generation_aborts_and_frees_the_slot(
    slow_gateway: tuple[LiveGateway, MemoryLimiter], path: str, body: dict[str, object]
) -> None:
    gw, limiter = slow_gateway
    key = gw.tenant("acme", max_concurrent=1)
    _send_and_hang_up(gw, key, path, {"model": "tiny", "max_tokens": MAX_TOKENS, **body})
    record = _wait_record(gw)
    assert record is not None, "the request ran on after its client left"
    assert record.client_disconnected and record.status == 499
    assert record.finish_reason == "abort"
    assert 1 <= record.completion_tokens < MAX_TOKENS  # the partial output is billed
    assert record.prompt_tokens > 0
    assert not gw.engine.stats().num_running  # the engine request was stopped
    deadline = time.monotonic() + 5
    while limiter.open_leases() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limiter.open_leases() == 0
    # The slot is free: the tenant's next request is admitted (max_concurrent=1).
    r = httpx.post(
        gw.base_url + path,
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "tiny", "max_tokens": 2, **body},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert len(gw.usage.records) == 2


def test_client_gone_gives_its_tokens_in_flight_back_exactly_once(
    slow_gateway: tuple[LiveGateway, MemoryLimiter],
) -> None:
    gw, limiter = slow_gateway
    # Room for one request of MAX_TOKENS output, not two.
    key = gw.tenant("acme", max_tokens_in_flight=MAX_TOKENS + 100)
    with gw.sessions() as s:
        scope = f"t:{store.get_tenant(s, 'acme').id}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    _send_and_hang_up(gw, key, "/v1/chat/completions", {**body, "max_tokens": MAX_TOKENS})
    record = _wait_record(gw)
    assert record is not None and record.status == 499
    deadline = time.monotonic() + 5
    while limiter.open_leases() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limiter.open_leases() == 0 and limiter.tokens_in_flight(scope) == 0
    # All of it came back (nothing held), and the tenant's next request is admitted.
    r = httpx.post(
        gw.base_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={**body, "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert len(gw.usage.records) == 2
