"""Why the engine server turned a request away, said once for both of its transports.

The refusal itself (status, message, type, code, param and, for an overloaded engine,
the seconds to wait) comes from the hop's one table (engine_hop.refusals), which the
gateway reads back with. Over HTTP it is an error response (with `retry-after`); over
the link (engine_server.link) it is an error frame with the same fields.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from engine.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError
from engine_hop.refusals import (
    BAD_REQUEST,
    FAILED,
    NOT_FOUND,
    OVERLOADED,
    TOO_LARGE,
    UNAUTHORIZED,
    UNAVAILABLE,
    Refusal,
    RefusalKind,
    refusal,
    refusal_of,
)
from engine_hop.sse import StreamRefused

__all__ = [
    "BAD_REQUEST",
    "FAILED",
    "NOT_FOUND",
    "OVERLOADED",
    "REFUSED_ERRORS",
    "TOO_LARGE",
    "UNAUTHORIZED",
    "UNAVAILABLE",
    "Refusal",
    "Refused",
    "refusal",
    "refusal_of",
    "refused",
    "response_of",
]

REFUSED_ERRORS = (InvalidRequestError, EngineOverloadedError, EngineDeadError)


def response_of(refused: Refusal) -> JSONResponse:
    """The HTTP error response of a refusal, with `retry-after` when there is one."""
    response = JSONResponse(refused.body(), status_code=refused.status)
    if refused.retry_after_s is not None:
        response.headers["retry-after"] = str(refused.retry_after_s)
    return response


class Refused(StreamRefused):
    """Carries a refusal out of a helper (or out of a stream's opener)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(response_of(refusal))
        self.refusal = refusal


def refused(
    kind: RefusalKind, message: str, *, code: str | None = None, param: str | None = None
) -> Refused:
    """A `Refused` carrying a refusal of `kind` (engine_hop.refusals.refusal)."""
    return Refused(refusal(kind, message, code=code, param=param))
