"""Server-sent events as both ends of the hop send them: the framing and the stream response.

One event is `data: {json}` followed by a blank line (`sse_chunk`); a completions
stream ends with `DONE` (`data: [DONE]`). The gateway and the engine server end
their completion streams with it; the engine server frames a request's events with
`event_chunks`, as plain OpenAI chunks (`openai_chunk_encoder`) or in the compact form.

`EventStream` is the completions stream as an ASGI response, leaner than Starlette's.
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
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.outputs import StreamEvent
from engine_hop.refusals import refusal_of
from engine_hop.wire import DONE_CHUNK, event_to_wire, sse_chunk

__all__ = [
    "DONE",
    "MEDIA_TYPE",
    "EventStream",
    "StreamRefused",
    "event_chunks",
    "openai_chunk_encoder",
    "sse_chunk",
]

DONE = DONE_CHUNK  # the last event of a completions stream
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


def openai_chunk_encoder(request_id: str, model: str) -> Callable[[StreamEvent], dict[str, Any]]:
    """The encoder of one request's events as OpenAI completion chunks, each with the
    engine's event under `cloister` (for clients other than the gateway)."""
    created = int(time.time())

    def encode(event: StreamEvent) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": d.index,
                    "text": d.text,
                    "logprobs": None,
                    "finish_reason": d.finish_reason,
                }
                for d in event.deltas
            ],
            "cloister": event_to_wire(event),
        }

    return encode


async def event_chunks(
    events: AsyncGenerator[StreamEvent, None], encode: Callable[[StreamEvent], Any]
) -> AsyncGenerator[bytes, None]:
    """Server-sent events: one chunk per event, an in-band error if the request
    failed, then [DONE], which rides with the last chunk (EventStream sends it with
    the body's end: one write)."""
    ended = False
    try:
        async for event in events:
            chunk = sse_chunk(encode(event))
            ended = event.finished
            yield chunk + DONE if ended else chunk
    except Exception as exc:  # the request failed in the engine: say so in-band
        ended = True
        yield sse_chunk(refusal_of(exc).body()) + DONE
    finally:
        await events.aclose()  # closed here on a hang-up, not whenever it is collected
    if not ended:
        yield DONE
