"""A size cap on the admin API's JSON bodies, enforced while they stream in.

FastAPI reads a route's whole JSON body before any dependency runs, so the cap
lives in the route class: a `Content-Length` over it is refused before a byte is
read, and a chunked body as soon as the bytes received pass it (413). The
JSON must be strict UTF-8 without lone surrogates, which no database or audit
record can store (400). Routes without a JSON body (the adapter upload streams
its own) are left alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

MAX_JSON_BODY_BYTES = 1024 * 1024  # admin bodies are names and settings, far below this
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


async def read_capped(request: Request, limit: int = MAX_JSON_BODY_BYTES) -> bytes:
    """The body's bytes; 413 as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise HTTPException(400, "the Content-Length header is not a number")
        if int(declared) > limit:
            raise HTTPException(413, _too_large(limit))
    received = bytearray()
    async for chunk in request.stream():
        received += chunk
        if len(received) > limit:
            raise HTTPException(413, _too_large(limit))
    return bytes(received)


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return not value.isascii() and any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class CappedRequest(Request):
    """A request whose `body()` is read under MAX_JSON_BODY_BYTES and `json()` is strict."""

    async def body(self) -> bytes:
        """The body, read once under the cap."""
        if not hasattr(self, "_body"):
            self._body = await read_capped(self)
        return self._body

    async def json(self) -> Any:
        """The body as JSON; 400 for invalid UTF-8 or a lone surrogate in a string."""
        if not hasattr(self, "_json"):
            try:
                text = (await self.body()).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise HTTPException(400, "the request body is not valid UTF-8") from exc
            data = json.loads(text)
            try:
                lone = _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(data)
            except RecursionError as exc:
                raise HTTPException(400, "the request body is nested too deeply") from exc
            if lone:
                raise HTTPException(400, "the request body has a lone UTF-16 surrogate")
            self._json = data
        return self._json


class CappedJsonRoute(APIRoute):
    """An APIRoute that reads its JSON body through CappedRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped when the route takes a JSON body."""
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def capped(request: Request) -> Response:
            return await handler(CappedRequest(request.scope, request.receive))

        return capped
