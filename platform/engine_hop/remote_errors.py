"""What an engine server's refusals mean to the gateway, on either transport.

An engine server refuses a request with an OpenAI error: over HTTP as the response
(status, body, `retry-after`), over the link as an error frame with the same fields.
Both are read here into the engine's own errors by the hop's one table
(engine_hop.refusals), `param` and `code` included, so the gateway and its replica set
treat a remote refusal as they treat an in-process one: a 400 is the tenant's, an
overload is retried on another replica, anything else means the replica is unavailable.
The adapter calls' bad requests (engine_hop.remote_adapters) are read the same way.

A remote request's refusal arrives after `submit` returned; `Admission` holds it until
the gateway asks (`admitted`), so that it is raised before the gateway answers its
client, as an in-process refusal is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from engine_hop.refusals import EngineUnavailableError, Refusal, error_of, refusal_from_fields

__all__ = [
    "Admission",
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


class Admission:
    """Whether an engine server admitted one request, decided by the first thing it says
    of it: its acceptance (or, from a server that sends none, its first event), or its
    refusal, or the transport's failure before either."""

    __slots__ = ("_decided", "_refusal")

    def __init__(self) -> None:
        self._decided = asyncio.Event()
        self._refusal: BaseException | None = None

    def accept(self) -> None:
        """The engine took the request (unless it was decided already)."""
        self.note(None)

    def note(self, item: object) -> None:
        """Decides on the stream's first item (an error refuses); later ones change nothing."""
        if self._decided.is_set():
            return
        if isinstance(item, BaseException):
            self._refusal = item
        self._decided.set()

    async def wait(self) -> None:
        """Returns once the request was admitted; raises its refusal (the engine's own error,
        engine_hop.refusals) or the failure that came first."""
        await self._decided.wait()
        if self._refusal is not None:
            raise self._refusal
