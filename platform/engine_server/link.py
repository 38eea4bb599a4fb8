"""The link: one WebSocket from a gateway carrying all of its requests to this engine.

Over HTTP each request costs a request line, headers, a route and a chunked response
on both sides, about half a millisecond of the hop's time in Python's HTTP stacks
(bench/engine_hop.py). A gateway that talks to its own engines opens one WebSocket
at `/internal/link` (engine_hop.wire.LINK_PATH) instead (service credential on the
handshake) and sends framed messages over it, in binary frames of JSON (orjson):

    gateway -> engine   {"op": "submit", "id": ID, "body": BODY, "headers": HEADERS}
                        {"op": "abort", "id": ID}
    engine -> gateway   {"id": ID, "a": 1}           admitted by the engine (sent only
                                                     to a gateway that asks on the
                                                     handshake, engine_hop.wire)
                        {"id": ID, "e": EVENT}       one event, in the compact form
                        [MESSAGE, MESSAGE, ...]      the events of one engine step
                        {"id": ID, "x": REFUSAL}     refused: status, message, type,
                                                     code, param, retry_after_s
                                                     (engine_hop.refusals)
                        {"id": ID, "f": MESSAGE}     failed in the engine mid-stream
                        {"op": "draining"}           this engine admits nothing new

BODY and HEADERS are what the HTTP route takes (engine_hop.wire), so a request
means the same on both transports, and is checked by the same code. The events one
engine step makes for a gateway's requests go in one frame, sent once the step's report
has been routed (`EngineFront.after_each_report`): with many requests in flight, one
write a step instead of one a request. A request's accepted frame is batched the same
way, and sent on the loop's next turn at the latest, before any of its events. The
link ends a request as a hang-up does: an abort, or the WebSocket closing, aborts what is in
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

from engine.outputs import StreamEvent
from engine_hop.eager import start_now
from engine_hop.wire import (
    ACCEPTED_FEATURE,
    ACCEPTED_KEY,
    LINK_FEATURES_HEADER,
    REQUEST_ID_HEADER,
    event_to_compact,
)
from engine_server.refusals import (
    BAD_REQUEST,
    FAILED,
    UNAUTHORIZED,
    UNAVAILABLE,
    Refusal,
    Refused,
    refusal,
    response_of,
)
from engine_server.tracing import GenerateSpan

if TYPE_CHECKING:
    from engine_server.app import EngineServer

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
        # The front says when a report has been routed: events are batched until then.
        server.front.after_each_report(self.flush)

    def flush(self) -> None:
        """Sends each connection's batched events."""
        for connection in list(self._connections):
            connection.flush()

    def connections(self) -> int:
        """Gateways linked now."""
        return len(self._connections)

    def in_flight(self) -> int:
        """Requests streaming over any link now."""
        return sum(len(c.requests) for c in self._connections)

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
            connection.post({"op": "draining"})

    async def endpoint(self, websocket: WebSocket) -> None:
        """Serves one gateway's link until it closes."""
        server = self.server
        denied = server.auth.check(websocket.headers.get("authorization"))
        if denied is not None:
            await websocket.send_denial_response(response_of(refusal(UNAUTHORIZED, denied)))
            return
        if server.draining:
            draining = refusal(UNAVAILABLE, "the engine is draining")
            await websocket.send_denial_response(response_of(draining))
            return
        await websocket.accept()
        # Whether the gateway reads accepted frames (an older one takes them for malformed).
        features = websocket.headers.get(LINK_FEATURES_HEADER, "")
        says_accepted = ACCEPTED_FEATURE in features.replace(" ", "").split(",")
        connection = _Connection(self, websocket, says_accepted=says_accepted)
        self._connections.add(connection)
        try:
            await connection.serve()
        finally:
            self._connections.discard(connection)
            await connection.close()
            self._update_idle()


class _Connection:
    """One gateway's WebSocket and the requests it has in flight.

    Nothing here runs a task per request: a request's events reach `_LinkRequest`
    within the engine's step report (`RequestStream.listen`) and are batched; the
    report's batch is written (`start_now`) as soon as the report has been routed, so an
    event costs no event-loop wake-up of its own between the engine and the socket.
    """

    def __init__(
        self, link: EngineLink, websocket: WebSocket, *, says_accepted: bool = False
    ) -> None:
        """`says_accepted`: send each admitted request's accepted frame."""
        self.link, self.websocket = link, websocket
        self.requests: dict[str, _LinkRequest] = {}
        self.says_accepted = says_accepted
        self._open = True
        # While the transport is paused, a send waits; later frames queue behind it.
        self._sending: asyncio.Future[None] | None = None
        self._backlog: list[bytes] = []
        self._tasks: set[asyncio.Future[None]] = set()  # submits that wait, aborts
        # Events waiting for `flush`, each encoded when posted, so that one that cannot
        # be encoded fails its own request (`_LinkRequest.on_item`), not the batch.
        self._batch: list[bytes] = []

    def post(self, message: dict[str, Any]) -> None:
        """Sends one message now (after the batched events, which it must not overtake),
        or after the frames before it if the socket is backed up; a closed socket is the
        reader's to notice."""
        if not self._open:
            return
        data = orjson.dumps(message)
        if self._batch:
            self._batch.append(data)
            self.flush()
            return
        self._write(data)

    def post_event(self, message: dict[str, Any]) -> None:
        """Batches a request's event until `flush`: when the report it came in has been
        routed, or on the loop's next turn for one handed over outside a report."""
        if not self._open:
            return
        self._batch.append(orjson.dumps(message))
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Sends the batched messages in one frame: the message alone, or an array."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        if self._open:
            self._write(batch[0] if len(batch) == 1 else b"[" + b",".join(batch) + b"]")

    def _write(self, data: bytes) -> None:
        if self._sending is not None:
            self._backlog.append(data)
            return
        try:
            pending = start_now(self.websocket.send_bytes(data))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._open = False
            return
        if pending is not None:
            self._sending = asyncio.ensure_future(self._flush(pending))

    async def _flush(self, pending: asyncio.Future[None]) -> None:
        """Finishes a send that had to wait, then sends what queued behind it."""
        try:
            await pending
            while self._backlog and self._open:
                await self.websocket.send_bytes(self._backlog.pop(0))
        except Exception:  # a socket that cannot take a frame takes no more
            self._open = False
        finally:
            self._backlog.clear()
            self._sending = None

    def track(self, future: asyncio.Future[None]) -> None:
        """Keeps `future` (a submit waiting on the tokenizer, an abort) until it is done,
        so that closing the link can wait for it."""
        self._tasks.add(future)
        future.add_done_callback(self._tasks.discard)

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
                malformed = refusal(BAD_REQUEST, str(exc), code="invalid_link_frame")
                self.post({"id": None, "x": malformed.fields()})
                continue
            if op == "abort":
                request = self.requests.get(request_id)
                if request is not None:
                    request.leave()
                continue
            if request_id in self.requests:
                twice = refusal(BAD_REQUEST, "a request with this id is in flight")
                self.post({"id": request_id, "x": twice.fields()})
                continue
            headers[REQUEST_ID_HEADER] = request_id
            request = _LinkRequest(self, request_id)
            self.requests[request_id] = request
            self.link._update_idle()
            # A prompt of token ids is submitted right here; one of text waits for the
            # tokenizer on a worker thread, and the link reads on meanwhile.
            pending = start_now(request.submit(body, headers))
            if pending is not None:
                self.track(pending)

    def abort_in_engine(self, request_id: str) -> None:
        """Aborts a request in the engine, freeing its blocks, without waiting here."""
        self.track(asyncio.ensure_future(self.link.server.front.abort(request_id)))

    def ended(self, request_id: str) -> None:
        """Takes a request that ended out of those in flight."""
        self.requests.pop(request_id, None)
        self.link._update_idle()

    async def close(self) -> None:
        """Aborts what is still in flight (the gateway is gone)."""
        self._open = False
        for request in list(self.requests.values()):
            request.leave()
        tasks = list(self._tasks)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class _LinkRequest:
    """One request on a link: submitted to the engine, its events sent as frames."""

    def __init__(self, connection: _Connection, request_id: str) -> None:
        self.connection, self.request_id = connection, request_id
        self.span: GenerateSpan | None = None
        self.ended = False

    async def submit(self, body: dict[str, Any], headers: Mapping[str, str]) -> None:
        """Submits the request, or sends its refusal."""
        server = self.connection.link.server
        try:
            engine_request = await server.engine_request(body, headers)
            if self.ended:  # the gateway aborted it while its prompt was tokenized
                return
            self.span = server.span(engine_request, headers)
            stream = server.submit(engine_request, self.span)
        except Refused as refused:
            self._refuse(refused.refusal)
            return
        except Exception:  # a bug: refuse this request, keep the link
            logger.exception("submitting a link request failed")
            self._refuse(refusal(FAILED, "the engine server failed"))
            return
        if self.connection.says_accepted:  # before any event, which `listen` may hand over
            self.connection.post_event({"id": self.request_id, ACCEPTED_KEY: 1})
        stream.listen(self.on_item)

    def _refuse(self, refusal: Refusal) -> None:
        if not self.ended:
            self.connection.post({"id": self.request_id, "x": refusal.fields()})
            self._end(None)

    def on_item(self, item: StreamEvent | BaseException) -> None:
        """One item of the request's stream, within the engine's report: a frame."""
        if self.ended:
            return  # left by the gateway; the engine's abort is on its way
        try:
            if isinstance(item, BaseException):  # failed in the engine: say so in-band
                self._end(item)
                self.connection.post({"id": self.request_id, "f": str(item) or type(item).__name__})
                return
            if self.span is not None:
                self.span.observe(item)
            self.connection.post_event({"id": self.request_id, "e": event_to_compact(item)})
            if item.finished:
                self._end(None)
        except Exception:  # never break the report the other requests' events are in
            logger.exception("sending a link event failed")
            self.leave()
            with contextlib.suppress(Exception):
                failure = "the engine server could not send the request's events"
                self.connection.post({"id": self.request_id, "f": failure})

    def leave(self) -> None:
        """The gateway aborted the request or went away: stop it in the engine."""
        if self.ended:
            return
        self._end(None, aborted=True)
        self.connection.abort_in_engine(self.request_id)

    def _end(self, error: BaseException | None, *, aborted: bool = False) -> None:
        self.ended = True
        if self.span is not None:
            self.span.end(error, aborted=aborted)
        self.connection.ended(self.request_id)
