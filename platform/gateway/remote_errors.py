"""What an engine server's refusals mean to the gateway, on either transport.

An engine server refuses a request with an OpenAI error: over HTTP as the response
(status, body, `retry-after`), over the link as an error frame with the same fields
(engine_server.refusals). Both become the engine's own errors here, so the gateway
and its replica set treat a remote refusal as they treat an in-process one: a 400 is
the tenant's, an overload is retried on another replica, anything else means the
replica is unavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from engine.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError


class EngineUnavailableError(EngineDeadError):
    """The engine server cannot be reached or answered with a server error."""


def error_of_refusal(
    status: int, message: str, code: str | None, retry_after_s: float | None
) -> Exception:
    """The engine error of a refusal with these fields."""
    if status == 400:
        exc = InvalidRequestError(message)
        if code:
            exc.code = str(code)
        return exc
    if status == 503 and code == "engine_overloaded":
        return EngineOverloadedError(message, retry_after_s=retry_after_s or 1.0)
    return EngineUnavailableError(f"engine server answered {status}: {message}")


def error_of_response(status: int, raw: bytes, headers: Mapping[str, str]) -> Exception:
    """The engine error of an HTTP error response."""
    try:
        err = orjson.loads(raw)["error"]
        message, code = str(err.get("message")), err.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = raw[:200].decode(errors="replace"), None
    return error_of_refusal(status, message, code, float(headers.get("retry-after") or 1.0))


def error_of_frame(fields: Mapping[str, Any]) -> Exception:
    """The engine error of the link's error frame (ValueError/TypeError if malformed)."""
    code, retry = fields.get("code"), fields.get("retry_after_s")
    return error_of_refusal(
        int(fields["status"]),
        str(fields["message"]),
        None if code is None else str(code),
        None if retry is None else float(retry),
    )
