"""Over HTTP, on both transports: a stuck engine fails only the stuck request.

The engine server runs the real engine over the fake fast model, which goes silent (a live process and socket,
no events) on the prompts that ask it to, before the first token or after two. The
gateway's client has a short read timeout (`CLOISTER_ENGINE_READ_TIMEOUT_S` in
production). The tenant whose request stalls gets the engine's 503 in OpenAI's error
format (or, mid-stream, an error event and the tokens it had), the engine is told to
abort, exactly one usage record is kept, and another tenant's stream is not held up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from engine.fronts.async_engine import AsyncEngine, RequestStream
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tenancy.limiter.memory import MemoryLimiter
from tests.gateway.engine_servers import serve_in_thread
from tests.gateway.test_engine_hop_wire import TOKEN
from tests.gateway.test_engine_link import client_of
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine
from tests.utils.live_gateway import LiveGateway, start_gateway
from tests.utils.scripted_engine import inject_script, one_token_per_char

READ_TIMEOUT_S = 0.8
# What greedy requests are answered: more characters than any test asks for.
REPLY = "abcdefgh" * 10


class SilencedStream(RequestStream):
    """A request's stream (the front's own, routed as usual) that hands on its first
    `after` items, then nothing: the request goes on in the engine, its consumer hears
    no more of it."""

    def __init__(self, stream: RequestStream, after: int) -> None:
        super().__init__(stream.request_id, stream.prompt, stream.key, stream.size)
        self._left = after

    def put(self, item: StreamEvent | BaseException) -> None:
        """Hands `item` on while the stream still speaks; drops it after."""
        if self._left > 0:
            self._left -= 1
            super().put(item)


class SilentEngine(AsyncEngine):
    """The real front over the fake fast model, answering greedy requests one character
    a token (tests/utils/scripted_engine.py); it falls silent on prompts that say
    STALL-FIRST (before any event) or STALL-MID (after two), until the request is aborted."""

    def __init__(self) -> None:
        llm = fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS)
        super().__init__(inject_script(llm, one_token_per_char(llm, REPLY)))
        self.abort_calls: list[str] = []

    def submit(self, request: EngineRequest) -> RequestStream:
        """The engine's stream, or one that goes silent."""
        stream = super().submit(request)
        # The gateway's client (tests/gateway/test_engine_link.py) tokenizes bytes.
        text = bytes(t for t in request.prompt_token_ids if t < 256).decode(errors="ignore")
        if "STALL-FIRST" in text:
            return self._silenced(stream, after=0)
        if "STALL-MID" in text:
            return self._silenced(stream, after=2)
        return stream

    def _silenced(self, stream: RequestStream, after: int) -> RequestStream:
        """`stream` replaced, where the front routes the request's events, by one that
        goes silent after `after` items (nothing was routed to it yet)."""
        silent = SilencedStream(stream, after)
        self._streams[stream.request_id] = silent
        return silent

    async def abort(self, request_id: str) -> None:
        """Records the call, then aborts."""
        self.abort_calls.append(request_id)
        await super().abort(request_id)


class Stuck:
    """A gateway over one engine server whose engine goes silent on request."""

    def __init__(self, gw: LiveGateway, engine: SilentEngine) -> None:
        self.gw, self.engine = gw, engine

    def abort_seen(self, timeout_s: float = 5.0) -> list[str]:
        """The engine's abort calls, once there is one (the abort races the response)."""
        deadline = time.monotonic() + timeout_s
        while not self.engine.abort_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.engine.abort_calls)


@pytest.fixture(params=["link", "http"])
def stuck(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stuck]:
    engine = SilentEngine()
    url, stop_engine = serve_in_thread(
        EngineServer(engine, model_name="tiny", auth=ServiceAuth(TOKEN)).app()
    )
    client = client_of(url, request.param, request_timeout_s=READ_TIMEOUT_S)
    gw, stop_gateway = start_gateway(tmp_path, engine=None, client=client, limiter=MemoryLimiter())
    try:
        yield Stuck(gw, engine)
    finally:
        stop_gateway()
        stop_engine()


def stream_chat(gw: LiveGateway, key: str, content: str, max_tokens: int) -> tuple[int, list[str]]:
    """Streams a chat completion: its status and its `data: ` lines."""
    with httpx.stream(
        "POST",
        gw.base_url + "/v1/chat/completions",
        json=body(content, stream=True, max_tokens=max_tokens),
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as r:
        return r.status_code, [line for line in r.iter_lines() if line.startswith("data: ")]


def body(content: str, *, stream: bool = False, max_tokens: int = 6) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }


def test_a_request_its_engine_stalls_on_is_a_503_and_another_tenant_streams_on(
    stuck: Stuck,
) -> None:
    gw = stuck.gw
    victim, bystander = gw.tenant("victim"), gw.tenant("bystander")
    # The bystander streams 60 tokens (about 0.6 s at 10 ms each) while the victim waits.
    flowing: dict[str, Any] = {}

    def stream_alongside() -> None:
        started = time.monotonic()
        flowing["status"], flowing["lines"] = stream_chat(gw, bystander, "tell me a story", 60)
        flowing["elapsed"] = time.monotonic() - started

    other = threading.Thread(target=stream_alongside)
    started = time.monotonic()
    other.start()
    r = httpx.post(
        gw.base_url + "/v1/chat/completions",
        json=body("STALL-FIRST please"),
        headers={"Authorization": f"Bearer {victim}"},
        timeout=30,
    )
    elapsed = time.monotonic() - started
    other.join(30)

    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["type"] and error["message"]
    assert TOKEN not in r.text and "127.0.0.1" not in r.text  # nothing internal
    assert READ_TIMEOUT_S * 0.9 <= elapsed < READ_TIMEOUT_S + 4.0
    # The engine was told to free it (over HTTP by the hang-up and by /internal/abort).
    assert set(stuck.abort_seen()) == {r.headers["x-request-id"]}

    assert flowing["status"] == 200 and flowing["lines"][-1] == "data: [DONE]"
    assert flowing["elapsed"] < 10
    records = {r.tenant_id: r for r in gw.usage.records}
    assert len(gw.usage.records) == 2
    victim_record = next(r for r in gw.usage.records if r.status != 200)
    assert victim_record.status == 503
    assert victim_record.completion_tokens == 0
    assert len(records) == 2


def test_a_stream_its_engine_stalls_in_ends_with_an_error_event_and_its_tokens_metered(
    stuck: Stuck,
) -> None:
    gw = stuck.gw
    key = gw.tenant("midway")
    status, lines = stream_chat(gw, key, "STALL-MID please", 20)
    assert status == 200
    chunks = [orjson.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "error" in chunks[-1], chunks[-1]
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert len(text) == 2  # the two tokens sent before the engine went silent
    assert set(stuck.abort_seen()) == {chunks[0]["id"]}
    deadline = time.monotonic() + 5
    while not gw.usage.records and time.monotonic() < deadline:  # written as the stream ends
        time.sleep(0.01)
    (record,) = gw.usage.records
    assert record.completion_tokens == 2
    assert record.finish_reason == "engine_error"
