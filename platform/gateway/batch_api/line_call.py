"""One batch line sent through the gateway app in-process, as an HTTP request would be.

Going through the app (its middleware, routes and error handlers) means a line is
validated, authorized, admitted, served and metered by exactly the code an interactive
request meets, and its failure carries the status and OpenAI error body a client
would have got. The line's caller is not a bearer key but the principal the runner
resolved from the batch's key: it travels in an ASGI scope entry, which only code in
this process can set.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

from server.request_ids import PINNED_ID_SCOPE_KEY
from tenancy.principal import Principal

BATCH_LINE_SCOPE_KEY = "cloister.batch_line"


@dataclass(frozen=True)
class BatchLineIdentity:
    """Who a batch line runs as: the batch's key, resolved (and re-checked) by the runner."""

    principal: Principal
    batch_id: str


@dataclass(frozen=True)
class LineResponse:
    """What the route answered: its status and JSON body (None if the body was not JSON)."""

    status: int
    body: Any


async def call_line(
    app: ASGIApp,
    endpoint: str,
    body: dict[str, Any],
    *,
    identity: BatchLineIdentity,
    request_id: str,
) -> LineResponse:
    """POSTs `body` to `endpoint` of `app` as `identity`, under the fixed `request_id`."""
    payload = json.dumps(body).encode()
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": endpoint,
        "raw_path": endpoint.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ],
        "client": None,
        "server": None,
        "state": {},
        BATCH_LINE_SCOPE_KEY: identity,
        PINNED_ID_SCOPE_KEY: request_id,
    }
    sent_body = False
    finished = asyncio.Event()
    status = 500
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": payload, "more_body": False}
        # The "client" stays until the response is complete: a disconnect earlier would
        # make the route abort the line as a client that went away.
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    raw = b"".join(chunks)
    try:
        parsed: Any = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    return LineResponse(status=status, body=parsed)
