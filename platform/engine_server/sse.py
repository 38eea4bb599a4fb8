"""`EventStream`: the completions stream as an ASGI response, leaner than Starlette's.

Starlette's `StreamingResponse` (under uvicorn's ASGI 2.3) runs each stream in an
anyio task group with a second task listening for the hang-up. This response runs
the stream in the request's own task, with one plain task waiting on `receive`:
a hang-up cancels the stream at once (its generator aborts the request), as before.

It also sends the status line and headers with the first chunk, not before it: a
client then wakes once for the first event rather than twice (headers, then chunk);
and the last chunk (the one ending with `last`, [DONE] for completions) goes out with
the body's end in one write, rather than three (chunk, [DONE], end). A caller that
waits on the request's admission (the gateway, engine_hop.wire) asks instead for the
status line as soon as the stream is open (`announce`): then a 200 means the engine
took the request, whatever its prefill takes.
The stream is opened (for completions: the request submitted to the engine) only
when the response is called, after the route's and the framework's own work; an
opener that refuses raises `StreamRefused`, and its error response goes out instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

MEDIA_TYPE = b"text/event-stream; charset=utf-8"


class StreamRefused(Exception):
    """A stream that could not be opened; `response` (an error) answers instead."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class EventStream(Response):
    """Sends the chunks `opener()` gives (already framed server-sent events) as a chunked
    200 response."""

    def __init__(
        self,
        opener: Callable[[], AsyncGenerator[bytes, None]],
        headers: Mapping[str, str],
        *,
        last: bytes,
        announce: bool = False,
    ) -> None:
        """`opener`: called once, when the response is sent (it may raise `StreamRefused`);
        `headers`: extra response headers (latin-1); a chunk that ends with `last` is
        the stream's last (the generator is closed after it); `announce`: send the
        status line once the opener returned, not with the first chunk."""
        self.opener = opener
        self.last = last
        self.announce = announce
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", MEDIA_TYPE),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Opens the stream and sends it until it ends or the client hangs up."""
        try:
            chunks = self.opener()
        except StreamRefused as refused:
            await refused.response(scope, receive, send)
            return
        streaming = asyncio.current_task()
        assert streaming is not None
        state = _State()

        async def hang_up() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state.ending:  # a disconnect after the last chunk is the normal end
                state.hung_up = True
                streaming.cancel()

        listener = asyncio.get_running_loop().create_task(hang_up())
        try:
            started = self.announce
            if started:  # the stream is open: the request was admitted
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
            end = b""
            async for chunk in chunks:
                if not started:
                    await send(
                        {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                    )
                    started = True
                if chunk.endswith(self.last):
                    end = chunk
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state.ending = True
            if not started:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
            await send({"type": "http.response.body", "body": end, "more_body": False})
        except asyncio.CancelledError:
            if not state.hung_up:
                raise
            streaming.uncancel()  # ours, not the server's: the request just ends
        finally:
            state.ending = True
            listener.cancel()
            await chunks.aclose()


class _State:
    """What the stream and its hang-up listener tell each other."""

    __slots__ = ("ending", "hung_up")

    def __init__(self) -> None:
        self.ending = False
        self.hung_up = False
