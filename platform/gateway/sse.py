"""Server-sent events as OpenAI sends them, and a response that always settles its request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from pydantic import BaseModel
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine_hop.sse import DONE

__all__ = [
    "DONE",
    "SettlingStreamingResponse",
    "json_model_response",
    "sse_event",
    "sse_model",
]


def sse_event(payload: dict[str, Any]) -> bytes:
    """One `data: {json}` event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def sse_model(model: BaseModel, *, exclude: set[str] | None = None) -> bytes:
    """One `data: {json}` event serialised by pydantic-core (3x cheaper than via a dict)."""
    return b"data: " + model.model_dump_json(exclude=exclude).encode() + b"\n\n"


def json_model_response(model: BaseModel, headers: dict[str, str] | None = None) -> Response:
    """A JSON response body serialised straight from the model, skipping a dict round trip."""
    return Response(model.model_dump_json(), media_type="application/json", headers=headers)


class SettlingStreamingResponse(StreamingResponse):
    """A StreamingResponse that awaits `on_close` however the stream ends.

    Starlette cancels the body when the client disconnects; the body's own
    `finally` may then run late (at garbage collection). This hook runs when the
    response itself ends, shielded, so the engine request is aborted and the
    limiter settled at once.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        on_close: Callable[[], Awaitable[None]],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Streams the body, then settles the request even on disconnect or cancellation."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()
