"""Every error becomes an OpenAI error body here, once, at the gateway's edge.

Mapping: bad input -> 400 (never 422, never 500); authentication -> 401; model not
allowed -> 403; unknown model or route -> 404; limits -> 429 with Retry-After and
x-ratelimit-*, too many bad credentials from one address -> 429 with Retry-After;
engine queue full, dead engine, limiter fail-closed or key store unavailable -> 503.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

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


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return error_response(
            400, "the request body is not valid JSON", type_="invalid_request_error"
        )
    param = _param_from_loc(first.get("loc", ()))
    message = f"{param}: {first.get('msg', 'invalid value')}" if param else "invalid request body"
    return error_response(400, message, type_="invalid_request_error", param=param)


async def _gateway(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return error_response(
        exc.status,
        exc.message,
        type_=exc.type,
        param=exc.param,
        code=exc.code,
        headers=exc.headers,
    )


# An engine's refusal is told from the hop's one table (engine_hop.refusals), as an
# engine server tells it, so that a tenant hears the same of an in-process engine and
# of a remote one. The words of the server-side kinds are the gateway's own: the
# engine's may name its internals.
OVERLOADED_MESSAGE = "the engine is at capacity; retry later"
UNAVAILABLE_MESSAGE = "the engine is not serving"


def engine_error_response(
    kind: RefusalKind,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The OpenAI error response of an engine refusal of `kind`."""
    return error_response(
        kind.status,
        message,
        type_=kind.type,
        param=param,
        code=kind.code or code,
        headers=headers,
    )


async def _engine_invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequestError)
    return engine_error_response(BAD_REQUEST, exc.message, param=exc.param, code=exc.code)


async def _engine_overloaded(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EngineOverloadedError)
    headers = retry_after_header(exc.retry_after_s)
    return engine_error_response(OVERLOADED, OVERLOADED_MESSAGE, headers=headers)


async def _engine_dead(request: Request, exc: Exception) -> JSONResponse:
    headers = retry_after_header(5.0)
    return engine_error_response(UNAVAILABLE, UNAVAILABLE_MESSAGE, headers=headers)


async def _engine_failed(request: Request, exc: Exception) -> JSONResponse:
    # The engine logged the cause with the request id; its text never reaches a tenant.
    return engine_error_response(FAILED, RequestFailedError.MESSAGE)


def stream_error_body(exc: BaseException, request_id: str) -> dict[str, Any]:
    """The in-band error event of a stream that failed after its 200 went out.

    The same words as the handlers above: a client error keeps its own message; any
    other failure gets a fixed one with a stable code, and its detail goes to the log.
    """
    if isinstance(exc, InvalidRequestError):
        detail = {"message": exc.message, "type": BAD_REQUEST.type, "param": exc.param}
        return {"error": {**detail, "code": exc.code}}
    if isinstance(exc, EngineOverloadedError):
        kind, message = OVERLOADED, OVERLOADED_MESSAGE
    elif isinstance(exc, EngineDeadError):
        kind, message = UNAVAILABLE, UNAVAILABLE_MESSAGE
    else:
        kind, message = FAILED, RequestFailedError.MESSAGE
        if not isinstance(exc, RequestFailedError):  # the engine logs its own failures
            logger.error("stream failed", exc_info=exc, extra={"request_id": request_id})
    return {"error": {"message": message, "type": kind.type, "param": None, "code": kind.code}}


async def _auth(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthenticationError)
    message = {
        "missing": "no API key provided; send Authorization: Bearer <key>",
        "invalid": "incorrect API key provided",
        "expired": "this API key has expired",
        "revoked": "this API key has been revoked",
        "suspended": "this tenant is suspended",
    }.get(exc.reason, "authentication failed")
    return error_response(
        401,
        message,
        type_="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _auth_throttled(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthThrottledError)
    return error_response(
        429,
        "too many failed authentication attempts from this address; retry later",
        type_="rate_limit_exceeded",
        code="too_many_auth_failures",
        headers=retry_after_header(exc.retry_after_s),
    )


async def _auth_unavailable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthUnavailableError)
    return error_response(
        503,
        "authentication is temporarily unavailable; retry later",
        type_="server_error",
        code="auth_unavailable",
        headers=retry_after_header(exc.retry_after_s),
    )


async def _denied(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PermissionDeniedError)
    return error_response(
        403, str(exc), type_="permission_error", param="model", code="model_not_allowed"
    )


async def _rate_limited(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RateLimitedError)
    budget = exc.reason == "budget"
    headers = {**retry_after_header(exc.retry_after_s)}
    headers.update(rate_limit_headers(exc.requests, exc.tokens))
    return error_response(
        429,
        str(exc),
        type_="insufficient_quota" if budget else exc.reason,
        code="insufficient_quota" if budget else "rate_limit_exceeded",
        headers=headers,
    )


async def _limiter_down(request: Request, exc: Exception) -> JSONResponse:
    return error_response(
        503,
        "rate limiting is unavailable; retry later",
        type_="server_error",
        code="limiter_unavailable",
        headers=retry_after_header(1.0),
    )


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return error_response(
        exc.status_code,
        str(exc.detail),
        type_=type_,
        headers=getattr(exc, "headers", None),
    )


def _internal_error() -> JSONResponse:
    # Never the exception's text: it may name files, keys or other tenants' data.
    return error_response(500, "internal server error", type_="server_error")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's ServerErrorMiddleware calls this (then re-raises, and uvicorn closes the
    # connection) only for an error UnexpectedErrorMiddleware did not answer: one raised
    # outside it, or after a response started.
    logger.exception("unhandled error", extra={"path": request.url.path})
    return _internal_error()


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
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(GatewayError, _gateway)
    app.add_exception_handler(InvalidRequestError, _engine_invalid)
    app.add_exception_handler(EngineOverloadedError, _engine_overloaded)
    app.add_exception_handler(EngineDeadError, _engine_dead)
    app.add_exception_handler(RequestFailedError, _engine_failed)
    app.add_exception_handler(AuthenticationError, _auth)
    app.add_exception_handler(AuthThrottledError, _auth_throttled)
    app.add_exception_handler(AuthUnavailableError, _auth_unavailable)
    app.add_exception_handler(PermissionDeniedError, _denied)
    app.add_exception_handler(RateLimitedError, _rate_limited)
    app.add_exception_handler(LimiterUnavailableError, _limiter_down)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


def status_of(exc: BaseException) -> int:
    """The HTTP status the handlers above give `exc` (for metrics and usage records).

    499 (client closed request) for a cancellation: the client went away first.
    """
    if isinstance(exc, GatewayError):
        return exc.status
    if isinstance(exc, (RequestValidationError, InvalidRequestError)):
        return 400
    if isinstance(
        exc, (EngineOverloadedError, EngineDeadError, LimiterUnavailableError, AuthUnavailableError)
    ):
        return 503
    if isinstance(exc, AuthThrottledError):
        return 429
    if isinstance(exc, AuthenticationError):
        return 401
    if isinstance(exc, PermissionDeniedError):
        return 403
    if isinstance(exc, RateLimitedError):
        return 429
    if isinstance(exc, StarletteHTTPException):
        return exc.status_code
    if not isinstance(exc, Exception):
        return 499
    return 500
