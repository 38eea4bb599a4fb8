"""Every error becomes an OpenAI error body here, once, at the gateway's edge.

Mapping: bad input -> 400 (never 422, never 500); authentication -> 401; model not
allowed -> 403; unknown model or route -> 404; limits -> 429 with Retry-After and
x-ratelimit-*, too many bad credentials from one address -> 429 with Retry-After;
engine queue full, dead engine, limiter fail-closed or key store unavailable -> 503.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.errors import (
    EngineDeadError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestFailedError,
)
from engine_hop.refusals import BAD_REQUEST, FAILED, OVERLOADED, UNAVAILABLE, RefusalKind
from gateway.ratelimit_headers import rate_limit_headers
from server.request_ids import current_request_ids
from tenancy.errors import (
    AuthenticationError,
    AuthThrottledError,
    AuthUnavailableError,
    LimiterUnavailableError,
    PermissionDeniedError,
    RateLimitedError,
)

logger = logging.getLogger("cloister.gateway")


class GatewayError(Exception):
    """An error the gateway raises itself, already carrying its HTTP shape."""

    status: int = 400
    type: str = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


class InvalidParameterError(GatewayError):
    """A parameter is malformed, out of range or not supported (400)."""


class ModelNotFoundError(GatewayError):
    """No model of that name is served here (404)."""

    status = 404


def error_response(
    status: int,
    message: str,
    *,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The OpenAI error body with `status`."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def retry_after_header(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds, at least 1 so clients never spin."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


# Where FastAPI found a bad value: the first element of a validation error's `loc`.
_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})


def _param_from_loc(loc: Sequence[Any]) -> str | None:
    # loc is ("body", "messages", 0, "content") for a body field and ("query", "limit")
    # for a query parameter; report the top field by its own name, not where it was.
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return parts[0] if parts else None


def _validation_message(exc: RequestValidationError) -> str:
    first = (exc.errors() or [{}])[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    param = _validation_param(exc)
    return f"{param}: {first.get('msg', 'invalid value')}" if param else "invalid request body"


def _validation_param(exc: RequestValidationError) -> str | None:
    first = (exc.errors() or [{}])[0]
    return None if first.get("type") == "json_invalid" else _param_from_loc(first.get("loc", ()))


# An engine's refusal is told from the hop's one table (engine_hop.refusals), as an
# engine server tells it, so that a tenant hears the same of an in-process engine and
# of a remote one. The words of the server-side kinds are the gateway's own: the
# engine's may name its internals.
OVERLOADED_MESSAGE = "the engine is at capacity; retry later"
UNAVAILABLE_MESSAGE = "the engine is not serving"

_AUTH_MESSAGES = {
    "missing": "no API key provided; send Authorization: Bearer <key>",
    "invalid": "incorrect API key provided",
    "expired": "this API key has expired",
    "revoked": "this API key has been revoked",
    "suspended": "this tenant is suspended",
}

T = TypeVar("T")
# A row's field: the same for every error of the row's type, or read from the error.
Field: TypeAlias = T | Callable[[Any], T]


def _none(exc: BaseException) -> None:
    return None


def _no_headers(exc: BaseException) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class ErrorRow:
    """How the errors of one exception type are told: an OpenAI error body and status.

    Each field is a value, or a function of the error for what differs between errors.
    `in_stream`: a stream that fails after its 200 tells the error as it is (in-band);
    an error of any other row is told there as the engine's failure.
    """

    status: Field[int]
    type: Field[str]
    message: Field[str] = str
    code: Field[str | None] = None
    param: Callable[[Any], str | None] = _none
    headers: Callable[[Any], Mapping[str, str]] = _no_headers
    in_stream: bool = False

    @classmethod
    def engine(
        cls,
        kind: RefusalKind,
        message: Field[str],
        headers: Callable[[Any], Mapping[str, str]] = _no_headers,
    ) -> ErrorRow:
        """The row of an engine refusal of `kind`: its status, type and code are the
        hop's (a kind without a code keeps the error's own, with its param)."""
        code: Field[str | None] = kind.code or (lambda e: e.code)
        param = _none if kind.code else (lambda e: e.param)
        return cls(kind.status, kind.type, message, code, param, headers, in_stream=True)

    def body(self, exc: BaseException) -> dict[str, Any]:
        """The OpenAI error body of `exc`."""
        detail: dict[str, Any] = {
            "message": _read(self.message, exc),
            "type": _read(self.type, exc),
        }
        return {"error": {**detail, "param": self.param(exc), "code": _read(self.code, exc)}}

    def response(self, exc: BaseException) -> JSONResponse:
        """The HTTP response of `exc`."""
        status: int = _read(self.status, exc)
        return JSONResponse(self.body(exc), status_code=status, headers=dict(self.headers(exc)))


def _read(field: Field[T], exc: BaseException) -> T:
    return field(exc) if callable(field) else field


def _rate_limited_headers(exc: RateLimitedError) -> dict[str, str]:
    return {
        **retry_after_header(exc.retry_after_s),
        **rate_limit_headers(exc.requests, exc.tokens),
    }


def _budget(exc: RateLimitedError) -> bool:
    return exc.reason == "budget"


# Never the exception's text: it may name files, keys or other tenants' data.
_UNEXPECTED = ErrorRow(500, "server_error", "internal server error")
_FAILED = ErrorRow.engine(FAILED, RequestFailedError.MESSAGE)

ERRORS: dict[type[Exception], ErrorRow] = {
    RequestValidationError: ErrorRow(
        400, "invalid_request_error", _validation_message, param=_validation_param
    ),
    GatewayError: ErrorRow(
        status=lambda e: e.status,
        type=lambda e: e.type,
        message=lambda e: e.message,
        code=lambda e: e.code,
        param=lambda e: e.param,
        headers=lambda e: e.headers,
    ),
    InvalidRequestError: ErrorRow.engine(BAD_REQUEST, lambda e: e.message),
    EngineOverloadedError: ErrorRow.engine(
        OVERLOADED, OVERLOADED_MESSAGE, lambda e: retry_after_header(e.retry_after_s)
    ),
    EngineDeadError: ErrorRow.engine(
        UNAVAILABLE, UNAVAILABLE_MESSAGE, lambda e: retry_after_header(5.0)
    ),
    # The engine logged the cause with the request id; its text never reaches a tenant.
    RequestFailedError: _FAILED,
    AuthenticationError: ErrorRow(
        401,
        "invalid_request_error",
        lambda e: _AUTH_MESSAGES.get(e.reason, "authentication failed"),
        "invalid_api_key",
        headers=lambda e: {"WWW-Authenticate": "Bearer"},
    ),
    AuthThrottledError: ErrorRow(
        429,
        "rate_limit_exceeded",
        "too many failed authentication attempts from this address; retry later",
        "too_many_auth_failures",
        headers=lambda e: retry_after_header(e.retry_after_s),
    ),
    AuthUnavailableError: ErrorRow(
        503,
        "server_error",
        "authentication is temporarily unavailable; retry later",
        "auth_unavailable",
        headers=lambda e: retry_after_header(e.retry_after_s),
    ),
    PermissionDeniedError: ErrorRow(
        403, "permission_error", str, "model_not_allowed", param=lambda e: "model"
    ),
    RateLimitedError: ErrorRow(
        429,
        type=lambda e: "insufficient_quota" if _budget(e) else e.reason,
        code=lambda e: "insufficient_quota" if _budget(e) else "rate_limit_exceeded",
        headers=_rate_limited_headers,
    ),
    LimiterUnavailableError: ErrorRow(
        503,
        "server_error",
        "rate limiting is unavailable; retry later",
        "limiter_unavailable",
        headers=lambda e: retry_after_header(1.0),
    ),
    StarletteHTTPException: ErrorRow(
        status=lambda e: e.status_code,
        type=lambda e: "invalid_request_error" if e.status_code < 500 else "server_error",
        message=lambda e: str(e.detail),
        headers=lambda e: getattr(e, "headers", None) or {},
    ),
    Exception: _UNEXPECTED,
}
"""The one mapping from exception types to OpenAI errors: the HTTP handlers, `status_of`
and `stream_error_body` all read it. An error takes the row of its nearest type."""


def error_row(exc: BaseException) -> ErrorRow | None:
    """The row of `exc`'s nearest type in `ERRORS` (None: not an Exception)."""
    if not isinstance(exc, Exception):
        return None
    rows = cast(dict[type, ErrorRow], ERRORS)
    return next(rows[cls] for cls in type(exc).__mro__ if cls in rows)


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    row = error_row(exc) or _UNEXPECTED
    if row is _UNEXPECTED:
        # Starlette's ServerErrorMiddleware calls this (then re-raises, and uvicorn closes
        # the connection) only for an error UnexpectedErrorMiddleware did not answer: one
        # raised outside it, or after a response started.
        logger.exception("unhandled error", extra={"path": request.url.path})
    return row.response(exc)


def stream_error_body(exc: BaseException, request_id: str) -> dict[str, Any]:
    """The in-band error event of a stream that failed after its 200 went out.

    The same words as the HTTP answer: an engine error is told by its row; any other
    failure as the engine's failure (a fixed message with a stable code), its detail
    going to the log.
    """
    row = error_row(exc)
    if row is not None and row.in_stream:
        return row.body(exc)
    if not isinstance(exc, RequestFailedError):  # the engine logs its own failures
        logger.error("stream failed", exc_info=exc, extra={"request_id": request_id})
    return _FAILED.body(exc)


def _internal_error() -> JSONResponse:
    return _UNEXPECTED.response(Exception())


class UnexpectedErrorMiddleware:
    """Pure ASGI, just inside Starlette's ServerErrorMiddleware: an exception that no
    handler took becomes the OpenAI 500 here, logged with its request id, and the
    keep-alive connection stays open.

    ServerErrorMiddleware sends its 500 and then re-raises, and uvicorn closes the
    connection of any request whose app raised: each unexpected error cost the client
    its connection. Still raised as before: an error once the response has started (a
    stream that fails midway cannot end cleanly on that connection), a client
    disconnect, and whatever is not an Exception (asyncio.CancelledError above all).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves `scope`, answering an unexpected error before the response began."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except ClientDisconnect:
            raise
        except Exception as exc:
            if started:
                raise
            ids = current_request_ids()
            extra = {"path": scope.get("path", "")}
            if ids is not None:
                extra["request_id"] = ids.own
            logger.error("unhandled error", exc_info=exc, extra=extra)
            await _internal_error()(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Registers the one mapping from exception types to OpenAI error responses (and the
    middleware answering unexpected errors without closing the connection)."""
    if not any(getattr(m, "cls", None) is UnexpectedErrorMiddleware for m in app.user_middleware):
        # Inside ServerErrorMiddleware, and inside any middleware added later.
        app.add_middleware(UnexpectedErrorMiddleware)
    for exc_type in ERRORS:
        app.add_exception_handler(exc_type, _handle)


def status_of(exc: BaseException) -> int:
    """The HTTP status `ERRORS` gives `exc` (for metrics and usage records).

    499 (client closed request) for a cancellation: the client went away first.
    """
    row = error_row(exc)
    return 499 if row is None else _read(row.status, exc)
