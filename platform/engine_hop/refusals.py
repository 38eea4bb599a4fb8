"""The one table of an engine's refusals, written by the engine server, read by the gateway.

Each kind of refusal has one HTTP status, one OpenAI error `type` and one `code`, here
and nowhere else. The engine server writes a refusal from it (`refusal_of`) as an HTTP
error response or as the link's error frame, carrying the same fields either way; the
gateway reads either back into the engine's own error (`error_of`), and answers the
tenant from the same table as it answers an engine error raised in its own process.
So a tenant is told the same whichever way its engine is reached.

    kind           status  type                   code                 param
    bad_request    400     invalid_request_error  the error's own      the error's own
    not_found      404     invalid_request_error  model_not_found      (none)
    unauthorized   401     authentication_error   invalid_token        (none)
    too_large      413     invalid_request_error  (none)               (none)
    overloaded     503     server_error           engine_overloaded    (none), + retry-after
    unavailable    503     server_error           engine_unavailable   (none)
    failed         500     server_error           engine_error         (none)

`param` travels as the OpenAI body's `param` over HTTP and as the frame's `param` over
the link. The in-process gateway's answers are the reference: an overload is a
`server_error`, as the gateway has always told tenants (not the engine server's former
`overloaded`), and a dead engine is `engine_unavailable` (not `engine_dead`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import (
    AdapterNotFoundError,
    ContextLengthExceededError,
    EngineDeadError,
    EngineOverloadedError,
    InvalidAdapterError,
    InvalidRequestError,
    KVQuotaExceededError,
    RequestFailedError,
    RequestTooLargeError,
)


@dataclass(frozen=True)
class RefusalKind:
    """One row of the table: how one kind of refusal is told, on every transport."""

    name: str
    status: int
    type: str
    code: str | None  # None: the refused error names its own code (bad requests)


BAD_REQUEST = RefusalKind("bad_request", 400, "invalid_request_error", None)
NOT_FOUND = RefusalKind("not_found", 404, "invalid_request_error", "model_not_found")
UNAUTHORIZED = RefusalKind("unauthorized", 401, "authentication_error", "invalid_token")
TOO_LARGE = RefusalKind("too_large", 413, "invalid_request_error", None)
OVERLOADED = RefusalKind("overloaded", 503, "server_error", "engine_overloaded")
UNAVAILABLE = RefusalKind("unavailable", 503, "server_error", "engine_unavailable")
FAILED = RefusalKind("failed", 500, "server_error", RequestFailedError.code)

KINDS: tuple[RefusalKind, ...] = (
    BAD_REQUEST,
    NOT_FOUND,
    UNAUTHORIZED,
    TOO_LARGE,
    OVERLOADED,
    UNAVAILABLE,
    FAILED,
)

# The engine's bad-request errors by their code, so that the gateway raises the same
# class the engine raised (a code not listed here reads as a plain InvalidRequestError).
_INVALID_BY_CODE: dict[str, type[InvalidRequestError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        ContextLengthExceededError,
        RequestTooLargeError,
        KVQuotaExceededError,
        AdapterNotFoundError,
        InvalidAdapterError,
    )
}


class EngineUnavailableError(EngineDeadError):
    """The engine server cannot be reached, or refused in a way no retry here mends."""


@dataclass(frozen=True)
class Refusal:
    """One refusal as it crosses the hop: an OpenAI error, and when a retry may help."""

    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    retry_after_s: int | None = None  # set for an overloaded engine only

    def body(self) -> dict[str, Any]:
        """The OpenAI error body (an HTTP response's)."""
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.code}}

    def fields(self) -> dict[str, Any]:
        """The refusal as the link's error frame carries it."""
        return {
            "status": self.status,
            "message": self.message,
            "type": self.type,
            "code": self.code,
            "param": self.param,
            "retry_after_s": self.retry_after_s,
        }


def refusal(
    kind: RefusalKind, message: str, *, code: str | None = None, param: str | None = None
) -> Refusal:
    """A refusal of `kind` (`code`: a bad request's own code; the kind's code otherwise)."""
    return Refusal(kind.status, message, kind.type, kind.code or code, param)


def refusal_of(exc: BaseException) -> Refusal:
    """How the engine server tells its caller that the engine refused, or failed, a request.

    A failure that is not a refusal (the engine died, or failed the request after taking
    it) reads as the engine being unavailable, with its message, as the stream's own
    failure does: the engine server's callers are gateways and routers, never tenants.
    """
    if isinstance(exc, InvalidRequestError):
        return refusal(BAD_REQUEST, exc.message, code=exc.code, param=exc.param)
    if isinstance(exc, EngineOverloadedError):
        retry = max(1, round(exc.retry_after_s))
        return replace(refusal(OVERLOADED, str(exc)), retry_after_s=retry)
    return refusal(UNAVAILABLE, str(exc))


def refusal_from_fields(fields: Mapping[str, Any]) -> Refusal:
    """The refusal of a link error frame's fields (KeyError/ValueError/TypeError if
    malformed); a field an older engine server does not send reads as None."""
    code, param, retry = fields.get("code"), fields.get("param"), fields.get("retry_after_s")
    return Refusal(
        status=int(fields["status"]),
        message=str(fields["message"]),
        type=str(fields.get("type")),
        code=None if code is None else str(code),
        param=None if param is None else str(param),
        retry_after_s=None if retry is None else max(1, round(float(retry))),
    )


def error_of(refused: Refusal) -> Exception:
    """The engine error a refusal stands for, as the gateway raises it: a bad request is
    the tenant's (with its code and param), an overload may be retried elsewhere, and
    anything else means the engine server is unavailable."""
    if refused.status == BAD_REQUEST.status:
        cls = _INVALID_BY_CODE.get(refused.code or "", InvalidRequestError)
        exc = cls(refused.message, param=refused.param)
        if refused.code and refused.code != exc.code:  # a code of the server's own
            exc.code = refused.code
        return exc
    if (refused.status, refused.code) == (OVERLOADED.status, OVERLOADED.code):
        return EngineOverloadedError(refused.message, retry_after_s=refused.retry_after_s or 1)
    return EngineUnavailableError(f"engine server answered {refused.status}: {refused.message}")
