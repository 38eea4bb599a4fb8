"""What an engine server's refusals mean to the gateway, on either transport.

An engine server refuses a request with an OpenAI error: over HTTP as the response
(status, body, `retry-after`), over the link as an error frame with the same fields.
Both are read here into the engine's own errors by the hop's one table
(engine_hop.refusals), `param` and `code` included, so the gateway and its replica set
treat a remote refusal as they treat an in-process one: a 400 is the tenant's, an
overload is retried on another replica, anything else means the replica is unavailable.
The adapter calls' bad requests (gateway.remote_adapters) are read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from engine_hop.refusals import EngineUnavailableError, Refusal, error_of, refusal_from_fields

__all__ = [
    "EngineUnavailableError",
    "error_of_frame",
    "error_of_response",
    "refusal_of_response",
]


def refusal_of_response(status: int, raw: bytes, headers: Mapping[str, str]) -> Refusal:
    """The refusal an HTTP error response carries: its OpenAI error body's fields (a body
    of another shape reads as a `server_error` with its first bytes as the message) and
    its `retry-after`."""
    retry = headers.get("retry-after")
    try:
        err = orjson.loads(raw)["error"]
        code, param = err.get("code"), err.get("param")
        refused = Refusal(
            status,
            str(err.get("message")),
            str(err.get("type")),
            None if code is None else str(code),
            None if param is None else str(param),
        )
    except (ValueError, KeyError, TypeError, AttributeError):  # not an OpenAI error body
        refused = Refusal(status, raw[:200].decode(errors="replace"), "server_error")
    if retry is not None and retry.isdigit():
        refused = replace(refused, retry_after_s=max(1, int(retry)))
    return refused


def error_of_response(status: int, raw: bytes, headers: Mapping[str, str]) -> Exception:
    """The engine error of an HTTP error response."""
    return error_of(refusal_of_response(status, raw, headers))


def error_of_frame(fields: Mapping[str, Any]) -> Exception:
    """The engine error of the link's error frame (ValueError/TypeError if malformed)."""
    return error_of(refusal_from_fields(fields))
