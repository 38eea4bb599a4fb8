"""The gateway's side of the link: one WebSocket to an engine server for all requests.

See engine_server.link for the frames; what they carry (the request's body and headers,
the compact events, the link's path) is engine_hop.wire, shared by both ends.
`EngineLink` keeps one connection per engine server, opened on first use and again
after it drops. A submit returns its
`LinkStream` at once; while the link is not open its frame waits on an outbox, and
one writer task connects and sends what the outbox holds. One reader task hands
each incoming frame to its stream. The handshake asks for accepted frames
(engine_hop.wire): a stream's `admitted` returns on its request's accepted frame and
raises its refusal frame, so that the gateway answers a refused request with its error
status before anything of a response went out.

A dropped link (the engine died, the network broke) ends every stream it carried
with `EngineUnavailableError`, as a broken HTTP stream does, and counts as a failed
poll of the replica; a stream that had no first token yet may then be retried
elsewhere by the replica set. Closing a stream early sends an abort frame; the
engine also aborts everything in flight when the link closes. Once the link is open,
a frame is written in the caller while the socket takes it (engine_hop.eager), as
the engine's side does: a writer task's wake-up cost about 0.07 ms of TTFT p50 in
bench/engine_hop.py.

A request the engine says nothing about for `read_timeout_s` (no event at all: a stuck
engine behind a live socket, whose pongs the heartbeat still sees) ends the way an HTTP
stream ends when its socket read times out: with `EngineUnavailableError`, a failed
poll, and an abort frame so that the engine frees its blocks if it ever gets to it.
One watchdog task checks the streams, and only while there are any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from engine.errors import EngineDeadError
from engine.outputs import StreamEvent
from engine.queued_stream import QueuedStream
from engine.request import EngineRequest
from engine_hop.eager import start_now
from engine_hop.remote_errors import Admission, EngineUnavailableError, error_of_frame
from engine_hop.wire import (
    ACCEPTED_FEATURE,
    ACCEPTED_KEY,
    LINK_FEATURES_HEADER,
    LINK_PATH,
    event_from_compact,
    request_to_wire,
)

logger = logging.getLogger("cloister.gateway.link")
HEARTBEAT_S = 10.0  # a link that misses a pong for half of this is closed
READ_TIMEOUT_S = 600.0  # the default wait for a request's next event, on either transport


class LinkStream(QueuedStream):
    """The events of one request sent over a link; iterate it, or `aclose` it."""

    def __init__(self, link: EngineLink, request_id: str, prompt: tuple[int, ...]) -> None:
        super().__init__(request_id, prompt)
        self._link = link
        self.heard = time.monotonic()  # when the engine last said something of it
        self.admission = Admission()

    def put(self, item: StreamEvent | BaseException) -> None:
        """Hands the stream its next item; the first decides its admission."""
        self.admission.note(item)
        super().put(item)

    async def admitted(self) -> None:
        """Returns once the engine admitted the request; raises its refusal (the engine's
        error) or the link's failure, whichever came first."""
        await self.admission.wait()

    def _ended(self) -> None:
        super()._ended()
        self._link.forget(self.request_id)

    async def aclose(self) -> None:
        """Stops the request: the engine aborts it and frees its blocks."""
        if not self.done:
            self.done = True
            self._link.cancel(self.request_id)
        self.admission.note(EngineUnavailableError("the request was closed before admission"))


class EngineLink:
    """The link to one engine server."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str],
        session: Callable[[], aiohttp.ClientSession],
        on_failure: Callable[[], None],
        on_draining: Callable[[], None],
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        """`headers`: the handshake's (the service credential); `session`: the aiohttp
        session to connect with; `on_failure`: called once per connect that fails or
        link that drops, and per watchdog round that ends stuck streams; `on_draining`:
        called when the engine says it drains; `read_timeout_s`: the longest wait for a
        request's next event (checked every quarter of it, at most every 5 s)."""
        if not read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be positive, not {read_timeout_s!r}")
        self.url = base_url.rstrip("/") + LINK_PATH
        self._headers = {**headers, LINK_FEATURES_HEADER: ACCEPTED_FEATURE}
        self._session = session
        self._on_failure, self._on_draining = on_failure, on_draining
        self._streams: dict[str, LinkStream] = {}
        self._outbox: list[bytes] = []
        self._wake = asyncio.Event()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._writer: asyncio.Task[None] | None = None
        self._sending = False  # the writer is sending frames
        self._pending: asyncio.Future[None] | None = None  # an inline send that waits
        self._reader: asyncio.Task[None] | None = None
        self._read_timeout_s = read_timeout_s
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False

    def open(self, request: EngineRequest, model: str, extra_headers: dict[str, str]) -> LinkStream:
        """Queues `request` for the engine and returns its stream."""
        if request.request_id in self._streams:
            raise ValueError(f"request {request.request_id!r} is already in flight")
        body, headers = request_to_wire(request, model)
        headers.update(extra_headers)
        stream = LinkStream(self, request.request_id, request.prompt_token_ids)
        self._streams[request.request_id] = stream
        self.send({"op": "submit", "id": request.request_id, "body": body, "headers": headers})
        if self._watchdog is None and not self._closed:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        return stream

    def send(self, message: dict[str, Any]) -> None:
        """Sends a frame: here and now on an open link with nothing queued or being sent
        (a send only waits while the transport is paused, so this costs no event-loop
        wake-up), else on the outbox, which the writer sends (connecting first if need
        be) after what is already on its way."""
        if self._closed:
            return
        frame = orjson.dumps(message)
        ws = self._ws
        # Frames on their way (the writer's, or an inline send that waits) go first.
        on_their_way = self._sending or (self._pending is not None and not self._pending.done())
        if ws is not None and not ws.closed and not self._outbox and not on_their_way:
            try:
                self._pending = start_now(ws.send_bytes(frame))
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                self._drop(f"the link to {self.url} broke: {exc!r}")
                return
            if self._pending is not None:
                self._pending.add_done_callback(self._sent_late)
            return
        self._outbox.append(frame)
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    def _sent_late(self, pending: asyncio.Future[None]) -> None:
        """An inline send that had to wait has finished: a failure breaks the link."""
        if not pending.cancelled() and pending.exception() is not None:
            self._drop(f"the link to {self.url} broke: {pending.exception()!r}")

    def forget(self, request_id: str) -> None:
        """Drops a stream that ended."""
        self._streams.pop(request_id, None)

    def cancel(self, request_id: str) -> None:
        """Drops a stream and, if the engine still runs its request, aborts it there."""
        if self._streams.pop(request_id, None) is not None:
            self.send({"op": "abort", "id": request_id})

    async def abort(self, request_id: str) -> None:
        """Stops the request if it streams over this link."""
        stream = self._streams.get(request_id)
        if stream is not None:
            await stream.aclose()

    async def _watch(self) -> None:
        """Ends the streams the engine has said nothing of for `read_timeout_s`."""
        period = min(self._read_timeout_s / 4, 5.0)
        try:
            while self._streams:
                await asyncio.sleep(period)
                limit = time.monotonic() - self._read_timeout_s
                stuck = [s for s in self._streams.values() if s.heard < limit]
                for stream in stuck:
                    self.cancel(stream.request_id)
                    stream.put(
                        EngineUnavailableError(
                            f"engine server {self.url} sent nothing for request "
                            f"{stream.request_id} in {self._read_timeout_s:g} s"
                        )
                    )
                if stuck:
                    self._on_failure()
        finally:
            self._watchdog = None

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if not self._outbox:
                    continue
                ws = self._ws
                if ws is None or ws.closed:
                    ws = await self._connect()
                    if ws is None:
                        continue
                frames, self._outbox = self._outbox, []
                self._sending = True
                try:
                    if self._pending is not None:  # an inline send's rest goes first
                        with contextlib.suppress(Exception):  # `_sent_late` has it
                            await self._pending
                        self._pending = None
                    for frame in frames:
                        await ws.send_bytes(frame)
                except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                    self._drop(f"the link to {self.url} broke: {exc!r}")
                finally:
                    self._sending = False
        except Exception as exc:  # a bug here must not leave streams waiting forever
            logger.exception("the link's writer failed")
            self._drop(f"the link to {self.url} failed: {exc!r}")

    async def _connect(self) -> aiohttp.ClientWebSocketResponse | None:
        """Opens the link; on failure, ends the streams waiting on it and returns None."""
        try:
            ws = await self._session().ws_connect(
                self.url, headers=self._headers, heartbeat=HEARTBEAT_S, autoping=True
            )
        except aiohttp.WSServerHandshakeError as exc:
            why = "refused the service credential (CLOISTER_SERVICE_TOKEN)"
            if exc.status != 401:
                why = f"answered {exc.status} to the link's handshake"
            self._drop(f"engine server {self.url} {why}")
            return None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._drop(f"engine server {self.url}: {exc!r}")
            return None
        self._ws = ws
        self._reader = asyncio.get_running_loop().create_task(self._read(ws))
        return ws

    def _drop(self, why: str) -> None:
        """Ends every stream in flight, and the frames not sent, with `why`."""
        self._outbox.clear()
        streams, self._streams = self._streams, {}
        if streams:
            self._on_failure()
        for stream in streams.values():
            stream.put(EngineUnavailableError(why))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        why = f"the engine server at {self.url} closed the link"
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY:
                    continue
                try:
                    frame = orjson.loads(message.data)
                    # One message, or the messages of one engine step.
                    for one in frame if isinstance(frame, list) else (frame,):
                        self._dispatch(one)
                except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                    why = f"a malformed frame from {self.url}: {exc!r}"
                    break
        except (aiohttp.ClientError, ConnectionError) as exc:
            why = f"the link to {self.url} broke: {exc!r}"
        finally:
            if self._ws is ws:
                self._ws = None
            with contextlib.suppress(Exception):
                await ws.close()
            self._drop(why)

    def _dispatch(self, frame: dict[str, Any]) -> None:
        if frame.get("op") == "draining":
            self._on_draining()
            return
        request_id = frame["id"]
        stream = self._streams.get(request_id) if isinstance(request_id, str) else None
        if stream is None:
            if "x" in frame:  # a frame the engine could not read: a bug on this side
                logger.error("the engine refused a link frame: %s", frame["x"].get("message"))
            return  # a stream that ended or was closed here
        stream.heard = time.monotonic()
        if "e" in frame:
            event = event_from_compact(request_id, frame["e"], stream.prompt)
            if event.finished:  # over on the engine: nothing to abort, even if never read
                self._streams.pop(request_id, None)
            stream.put(event)
        elif ACCEPTED_KEY in frame:
            stream.admission.accept()
        elif "x" in frame:
            self._streams.pop(request_id, None)
            stream.put(error_of_frame(frame["x"]))
        elif "f" in frame:
            self._streams.pop(request_id, None)
            stream.put(EngineDeadError(str(frame["f"])))
        else:
            raise KeyError("the frame has neither 'e', 'a', 'x' nor 'f'")

    async def close(self) -> None:
        """Ends the streams in flight and closes the link."""
        self._closed = True
        self._drop("the engine client was shut down")
        for task in (self._writer, self._reader, self._watchdog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
