"""An unexpected error is a 500 in OpenAI's format that keeps the connection (issue 46).

Starlette's ServerErrorMiddleware sends its 500 and re-raises, and uvicorn then closes
the connection: every unexpected error cost the client its keep-alive connection. Over
a real uvicorn server: the 500 names nothing of the error, is logged with its request
id, and the next request on the same client comes in on the same connection. A stream
that fails after its 200 still ends as before; cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from gateway.errors import UnexpectedErrorMiddleware
from server.request_ids import OWN_ID_HEADER
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

SECRET = "secret-detail-/etc/cloister/key"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """A gateway on the fast fake engine, with test-only routes that fail or name the peer."""
    tmp_path: Path = tmp_path_factory.mktemp("unexpected")
    gw, stop = start_gateway(tmp_path, engine=gateway_test_engine(), limiter=MemoryLimiter())

    async def boom(request: Request) -> JSONResponse:
        raise RuntimeError(SECRET)

    async def peer(request: Request) -> JSONResponse:
        assert request.client is not None
        return JSONResponse({"port": request.client.port})

    async def stream_boom(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: first\n\n"
            raise RuntimeError(SECRET)

        return StreamingResponse(chunks(), media_type="text/event-stream")

    gw.app.add_route("/test/boom", boom)
    gw.app.add_route("/test/peer", peer)
    gw.app.add_route("/test/stream-boom", stream_boom)
    yield gw
    stop()


def _port(client: httpx.Client) -> int:
    r = client.get("/test/peer")
    assert r.status_code == 200, r.text
    return int(r.json()["port"])


def _assert_openai_500(r: httpx.Response) -> None:
    assert r.status_code == 500, r.text
    assert r.json() == {
        "error": {
            "message": "internal server error",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert SECRET not in r.text and "Traceback" not in r.text


def test_an_unexpected_error_is_a_500_that_keeps_the_connection(live: LiveGateway) -> None:
    with httpx.Client(base_url=live.base_url, timeout=30) as client:
        first = _port(client)
        r = client.get("/test/boom")
        _assert_openai_500(r)
        assert r.headers.get("connection", "").lower() != "close"
        assert _port(client) == first  # the same connection served the next request
        again = client.get("/test/boom")
        _assert_openai_500(again)
        assert _port(client) == first
    own = r.headers[OWN_ID_HEADER]
    lines = [json.loads(line) for line in live.logs.getvalue().splitlines() if line.strip()]
    logged = [line for line in lines if line.get("request_id") == own]
    assert any(line["message"] == "unhandled error" for line in logged), logged
    assert any(SECRET in json.dumps(line) for line in logged)  # the detail is in the log


def test_an_error_in_a_real_route_keeps_the_connection(
    live: LiveGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = live.tenant("kept-alive")
    auth = live.app.state.cloister.auth

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError(SECRET)

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=live.base_url, timeout=30) as client:
        first = _port(client)
        monkeypatch.setattr(auth, "authenticate", broken)
        _assert_openai_500(client.get("/v1/models", headers=headers))
        monkeypatch.undo()
        assert client.get("/v1/models", headers=headers).status_code == 200
        assert _port(client) == first


def test_a_stream_that_fails_after_its_200_still_ends(live: LiveGateway) -> None:
    # Its headers went out: no clean response can follow on that connection, so the
    # error is raised as before (uvicorn ends the connection); the next request works.
    with httpx.Client(base_url=live.base_url, timeout=30) as client:
        with pytest.raises(httpx.HTTPError), client.stream("GET", "/test/stream-boom") as r:
            assert r.status_code == 200
            r.read()
        assert client.get("/test/peer").status_code == 200


def _scope() -> Scope:
    return {"type": "http", "method": "GET", "path": "/x", "headers": []}


async def _receive() -> Message:
    return {"type": "http.disconnect"}


def test_cancellation_and_errors_after_the_start_propagate() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def cancelled(scope: Scope, receive: Receive, send: Send) -> None:
        raise asyncio.CancelledError

    async def late(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("after the start")

    async def early(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("before the start")

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(UnexpectedErrorMiddleware(cancelled)(_scope(), _receive, send))
    assert sent == []
    with pytest.raises(RuntimeError, match="after the start"):
        asyncio.run(UnexpectedErrorMiddleware(late)(_scope(), _receive, send))
    assert [m["type"] for m in sent] == ["http.response.start"]
    sent.clear()
    asyncio.run(UnexpectedErrorMiddleware(early)(_scope(), _receive, send))
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["type"] == "server_error"
