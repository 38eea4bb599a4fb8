"""Why the engine server turned a request away, said once for both of its transports.

A refusal is an OpenAI error (status, message, type, code) plus, for an overloaded
engine, the seconds to wait before retrying. Over HTTP it is an error response (with
`retry-after`); over the link (engine_server.link) it is an error frame with the same
fields, and the gateway maps both to the same engine errors (gateway.remote_errors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from engine.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError
from engine_server.sse import StreamRefused


@dataclass(frozen=True)
class Refusal:
    """An OpenAI error, and when a retry may help."""

    status: int
    message: str
    type: str
    code: str | None = None
    retry_after_s: int | None = None  # set for an overloaded engine only

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {
            "error": {"message": self.message, "type": self.type, "param": None, "code": self.code}
        }

    def fields(self) -> dict[str, Any]:
        """The refusal as the link's error frame carries it."""
        return {
            "status": self.status,
            "message": self.message,
            "type": self.type,
            "code": self.code,
            "retry_after_s": self.retry_after_s,
        }

    def response(self) -> JSONResponse:
        """The HTTP error response, with `retry-after` when there is one."""
        response = JSONResponse(self.body(), status_code=self.status)
        if self.retry_after_s is not None:
            response.headers["retry-after"] = str(self.retry_after_s)
        return response


def refusal_of(exc: InvalidRequestError | EngineOverloadedError | EngineDeadError) -> Refusal:
    """How the engine's refusal of a request is told to the client."""
    if isinstance(exc, InvalidRequestError):
        return Refusal(400, exc.message, "invalid_request_error", exc.code)
    if isinstance(exc, EngineOverloadedError):
        retry = max(1, round(exc.retry_after_s))
        return Refusal(503, str(exc), "overloaded", "engine_overloaded", retry_after_s=retry)
    return Refusal(503, str(exc), "unavailable", "engine_dead")


REFUSED_ERRORS = (InvalidRequestError, EngineOverloadedError, EngineDeadError)


class Refused(StreamRefused):
    """Carries a refusal out of a helper (or out of a stream's opener)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.response())
        self.refusal = refusal


def refused(status: int, message: str, type_: str, code: str | None = None) -> Refused:
    """A `Refused` carrying that error."""
    return Refused(Refusal(status, message, type_, code))
