"""The link: one WebSocket from a gateway carrying all of its requests to this engine.

Over HTTP each request costs a request line, headers, a route and a chunked response
on both sides, about half a millisecond of the hop's time in Python's HTTP stacks
(bench/engine_hop.py). A gateway that talks to its own engines opens one WebSocket
at `/internal/link` instead (service credential on the handshake) and sends framed
messages over it, in binary frames of JSON (orjson):

    gateway -> engine   {"op": "submit", "id": ID, "body": BODY, "headers": HEADERS}
                        {"op": "abort", "id": ID}
    engine -> gateway   {"id": ID, "e": EVENT}       one event, in the compact form
                        {"id": ID, "x": REFUSAL}     refused: status, message, type,
                                                     code, retry_after_s
                        {"id": ID, "f": MESSAGE}     failed in the engine mid-stream
                        {"op": "draining"}           this engine admits nothing new

BODY and HEADERS are what the HTTP route takes (engine_server.wire), so a request
means the same on both transports, and is checked by the same code. The link ends
a request as a hang-up does: an abort, or the WebSocket closing, aborts what is in
flight and frees its blocks at once. The HTTP API stays for routers, the Kubernetes
inference stack's endpoint picker, and any other OpenAI client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from engine_server.refusals import Refusal, Refused
from engine_server.wire import REQUEST_ID_HEADER, event_to_compact

if TYPE_CHECKING:
    from engine_server.app import EngineServer

LINK_PATH = "/internal/link"
# uvicorn's WebSocket implementation for the link: the websockets library's sans-I/O
# protocol (its legacy one is deprecated).
UVICORN_WS = "websockets-sansio"
logger = logging.getLogger("cloister.engine_server.link")


class LinkProtocolError(ValueError):
    """A frame that is not a message of the link."""


def parse_message(raw: bytes | str) -> tuple[str, str, dict[str, Any], dict[str, str]]:
    """(op, request id, body, headers) of a gateway's frame; `LinkProtocolError` if it is
    not one (the body is checked later, as an HTTP body is)."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise LinkProtocolError("the frame is not JSON") from None
    if not isinstance(message, dict):
        raise LinkProtocolError("a frame must be an object")
    op, request_id = message.get("op"), message.get("id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 256:
        raise LinkProtocolError("'id' must be a non-empty string of at most 256 characters")
    if op == "abort":
        return op, request_id, {}, {}
    if op != "submit":
        raise LinkProtocolError(f"unknown op {op!r}: 'submit' or 'abort'")
    body, headers = message.get("body"), message.get("headers") or {}
    if not isinstance(body, dict):
        raise LinkProtocolError("'body' must be an object")
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise LinkProtocolError("'headers' must map strings to strings")
    return op, request_id, body, {k.lower(): v for k, v in headers.items()}


class EngineLink:
    """The `/internal/link` endpoint of one engine server; counts the streams in flight
    across its connections, so that a drain can wait for them."""

    def __init__(self, server: EngineServer) -> None:
        self.server = server
        self._connections: set[_Connection] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def connections(self) -> int:
        """Gateways linked now."""
        return len(self._connections)

    def in_flight(self) -> int:
        """Requests streaming over any link now."""
        return sum(len(c.tasks) for c in self._connections)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Waits until no request streams over a link (True), or `timeout_s` (False)."""
        self._update_idle()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _update_idle(self) -> None:
        if self.in_flight():
            self._idle.clear()
        else:
            self._idle.set()

    async def announce_draining(self) -> None:
        """Tells every connected gateway that this engine admits nothing new."""
        for connection in list(self._connections):
            await connection.send({"op": "draining"})

    async def endpoint(self, websocket: WebSocket) -> None:
        """Serves one gateway's link until it closes."""
        server = self.server
        denied = server.auth.check(websocket.headers.get("authorization"))
        if denied is not None:
            refusal = Refusal(401, denied, "authentication_error", "invalid_token")
            await websocket.send_denial_response(refusal.response())
            return
        if server.draining:
            refusal = Refusal(503, "the engine is draining", "unavailable")
            await websocket.send_denial_response(refusal.response())
            return
        await websocket.accept()
        connection = _Connection(self, websocket)
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            await connection.close()
            self._update_idle()


class _Connection:
    """One gateway's WebSocket and the requests it has in flight."""

    def __init__(self, link: EngineLink, websocket: WebSocket) -> None:
        self.link, self.websocket = link, websocket
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._open = True

    async def send(self, message: dict[str, Any]) -> None:
        """Sends one message; a closed socket is the reader's to notice."""
        if not self._open:
            return
        try:
            await self.websocket.send_bytes(orjson.dumps(message))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._open = False

    async def serve(self) -> None:
        """Reads frames until the gateway closes the link."""
        while True:
            frame = await self.websocket.receive()
            if frame["type"] == "websocket.disconnect":
                return
            raw = frame.get("bytes") or frame.get("text") or b""
            try:
                op, request_id, body, headers = parse_message(raw)
            except LinkProtocolError as exc:
                logger.warning("a malformed link frame: %s", exc)
                refusal = Refusal(400, str(exc), "invalid_request", "invalid_link_frame")
                await self.send({"id": None, "x": refusal.fields()})
                continue
            if op == "abort":
                task = self.tasks.get(request_id)
                if task is not None:
                    task.cancel()
                continue
            if request_id in self.tasks:
                refusal = Refusal(400, "a request with this id is in flight", "invalid_request")
                await self.send({"id": request_id, "x": refusal.fields()})
                continue
            headers[REQUEST_ID_HEADER] = request_id
            task = asyncio.get_running_loop().create_task(self._run(request_id, body, headers))
            self.tasks[request_id] = task
            self.link._update_idle()

    async def _run(self, request_id: str, body: dict[str, Any], headers: Mapping[str, str]) -> None:
        """Submits one request and sends its events, or its refusal or failure."""
        server = self.link.server
        try:
            try:
                engine_request = await server.engine_request(body, headers)
                span = server.span(engine_request, headers)
                stream = server.submit(engine_request, span)
            except Refused as refused:
                await self.send({"id": request_id, "x": refused.refusal.fields()})
                return
            events = server.events(request_id, stream, span)
            try:
                async for event in events:
                    await self.send({"id": request_id, "e": event_to_compact(event)})
            except Exception as exc:  # the request failed in the engine: say so in-band
                await self.send({"id": request_id, "f": str(exc) or type(exc).__name__})
            finally:
                await events.aclose()  # aborts a request left before its end
        finally:
            self.tasks.pop(request_id, None)
            self.link._update_idle()

    async def close(self) -> None:
        """Aborts what is still in flight (the gateway is gone)."""
        self._open = False
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
