"""Request ids on every HTTP response, and in every log line a request writes.

Each request has the server's own id (unique: the usage record's key, a completion's
`id`) and, when the client sent a valid `x-request-id`, the client's id too:

    x-request-id            the client's id if it sent a valid one, else the server's id
    x-cloister-request-id   always the server's own id

A client id is 1 to 128 visible ASCII characters (0x21-0x7e: no spaces, no control
characters, so it can never break a log line or a header). Any other value is
ignored, not refused: proxies add ids of their own, and refusing a request for a
header that changes nothing would be worse. The response then echoes the server's
id, so a client can see its own was not used. Client ids are not unique (retries
reuse them, two tenants may pick the same one): they are stored next to the
server's id (usage_records.client_request_id), never in its place.

`RequestIdMiddleware` wraps the whole app, outside Starlette's error middleware, so
that even an unhandled 500 carries the headers. It sets a context variable that
`RequestIdFilter` reads, so every record logged while serving the request carries
`request_id` (and `client_request_id`), whichever module logged it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from starlette.applications import Starlette
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
OWN_ID_HEADER = "x-cloister-request-id"
MAX_CLIENT_ID_CHARS = 128
_REQUEST_ID_BYTES = REQUEST_ID_HEADER.encode()
_OWN_ID_BYTES = OWN_ID_HEADER.encode()
STATE_KEY = "request_ids"  # in scope["state"], i.e. request.state.request_ids
# An in-process caller (the batch runner) may fix the server's id of a request it sends
# through the app, so that a retried call keeps its usage record's key. Only code in
# this process can put a key in the ASGI scope; no client header reaches it.
PINNED_ID_SCOPE_KEY = "cloister.pinned_request_id"
_CLIENT_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_CLIENT_ID_CHARS}}}")
_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})
_CURRENT: ContextVar[RequestIds | None] = ContextVar("cloister_request_ids", default=None)


def valid_client_id(value: str | None) -> str | None:
    """`value` if it is a usable client request id, else None (ignored)."""
    if value is None or _CLIENT_ID.fullmatch(value) is None:
        return None
    return value


class RequestIds:
    """The ids of one HTTP request: the client's (if valid) and the server's own.

    The server's id is drawn on first use, or assigned once by the code that owns the
    request (the gateway's lifecycle gives it a kind prefix such as `chatcmpl-`).
    """

    def __init__(
        self, client: str | None, draw: Callable[[], str], *, pinned: str | None = None
    ) -> None:
        self.client = client
        self._draw = draw
        self._own: str | None = pinned
        self._pinned = pinned is not None

    @property
    def own(self) -> str:
        """The server's unique id of this request."""
        if self._own is None:
            self._own = self._draw()
        return self._own

    def assign(self, own: str) -> str:
        """Makes `own` this request's id (before any response went out); returns it.

        A pinned id (PINNED_ID_SCOPE_KEY) stays: it is returned instead."""
        if self._pinned and self._own is not None:
            return self._own
        self._own = own
        return own

    @property
    def echoed(self) -> str:
        """What `x-request-id` answers: the client's id, or the server's."""
        return self.client or self.own

    def headers(self) -> dict[str, str]:
        """The response headers naming this request."""
        return {REQUEST_ID_HEADER: self.echoed, OWN_ID_HEADER: self.own}


def request_ids_of(conn: HTTPConnection) -> RequestIds | None:
    """The ids `RequestIdMiddleware` gave this request (None: no middleware ran)."""
    ids = conn.scope.get("state", {}).get(STATE_KEY)
    return ids if isinstance(ids, RequestIds) else None


def current_request_ids() -> RequestIds | None:
    """The ids of the request being served in this context, if any."""
    return _CURRENT.get()


class RequestIdMiddleware:
    """Pure ASGI: gives each HTTP request its ids and adds them to its response headers."""

    def __init__(self, app: ASGIApp, draw: Callable[[], str]) -> None:
        self.app = app
        self._draw = draw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves `scope` with its RequestIds in scope state and in the logging context."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = None
        for name, value in scope["headers"]:
            if name == _REQUEST_ID_BYTES:
                client = valid_client_id(value.decode("latin-1"))
                break
        pinned = scope.get(PINNED_ID_SCOPE_KEY)
        ids = RequestIds(client, self._draw, pinned=pinned if isinstance(pinned, str) else None)
        scope.setdefault("state", {})[STATE_KEY] = ids

        async def send_with_ids(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Raw pairs, appended: no route sets these headers itself, and this runs
                # on every response (MutableHeaders' scan-and-replace costs ~3x more).
                message["headers"] = [
                    *message.get("headers", ()),
                    (_REQUEST_ID_BYTES, ids.echoed.encode()),
                    (_OWN_ID_BYTES, ids.own.encode()),
                ]
            await send(message)

        token = _CURRENT.set(ids)
        try:
            await self.app(scope, receive, send_with_ids)
        finally:
            _CURRENT.reset(token)


def install_request_ids(app: Starlette, draw: Callable[[], str]) -> None:
    """Wraps `app`'s whole middleware stack (error middleware included) in the ids'.

    Starlette builds the stack on the first request; wrapping its builder keeps the
    app an ordinary FastAPI object for everything else (routers, state, lifespan).
    """
    build = app.build_middleware_stack

    def build_with_ids() -> ASGIApp:
        return RequestIdMiddleware(build(), draw)

    app.build_middleware_stack = build_with_ids  # type: ignore[method-assign]


class RequestIdFilter(logging.Filter):
    """Adds the current request's `request_id` (and `client_request_id`) to each record.

    A record that already names a `request_id` (an engine request's, say) keeps it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotates the record; never drops it."""
        ids = _CURRENT.get()
        if ids is None:
            return True
        fields: dict[str, Any] = vars(record)
        fields.setdefault("request_id", ids.own)
        if ids.client is not None:
            fields.setdefault("client_request_id", ids.client)
        return True


def describe_request_ids(paths: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI `paths` with the optional x-request-id parameter and both response headers
    added to every operation (in place; returned for convenience)."""
    parameter = {
        "name": REQUEST_ID_HEADER,
        "in": "header",
        "required": False,
        "description": (
            "Your id for this request, echoed in the response's x-request-id (and kept with "
            f"its usage record); 1 to {MAX_CLIENT_ID_CHARS} visible ASCII characters, any "
            "other value is ignored"
        ),
        "schema": {"type": "string", "maxLength": MAX_CLIENT_ID_CHARS, "pattern": "^[!-~]+$"},
    }
    headers = {
        REQUEST_ID_HEADER: {
            "description": "Your x-request-id if you sent a valid one, else the server's id",
            "schema": {"type": "string"},
        },
        OWN_ID_HEADER: {
            "description": "The server's unique id of this request (a completion's `id`)",
            "schema": {"type": "string"},
        },
    }
    for item in paths.values():
        for method, operation in item.items():
            if method not in _HTTP_METHODS:  # a path item's own summary or parameters
                continue
            operation.setdefault("parameters", []).append(parameter)
            for response in operation.get("responses", {}).values():
                response.setdefault("headers", {}).update(headers)
    return paths
