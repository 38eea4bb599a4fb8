"""Read and parse a JSON body after authentication, mapping every failure to a 4xx.

The body is read under a cap: a `Content-Length` over it is refused before a
byte is read, and a body sent without one (chunked) is refused as soon as the
bytes received pass it, so no request can make the gateway hold more than the
cap. Parsing refuses, as 400s, what would otherwise fail deep inside: invalid
UTF-8, lone surrogates (no tokenizer can encode them), nesting deeper than
Python's recursion limit and integers longer than its digit limit.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gateway.errors import GatewayError, InvalidParameterError

MAX_BODY_BYTES = 8 * 1024 * 1024
M = TypeVar("M", bound=BaseModel)
# A JSON escape of a UTF-16 surrogate; json.loads joins valid pairs into one code point.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class BodyTooLargeError(GatewayError):
    """The request body is over the cap (413)."""

    status = 413


def _too_large(limit: int) -> BodyTooLargeError:
    return BodyTooLargeError(
        f"the request body is larger than {limit} bytes", code="body_too_large"
    )


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body's bytes; BodyTooLargeError as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise InvalidParameterError("the Content-Length header is not a number")
        if int(declared) > limit:
            raise _too_large(limit)
    received = bytearray()
    async for chunk in request.stream():
        received += chunk
        if len(received) > limit:
            raise _too_large(limit)
    return bytes(received)


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def loads_json(raw: bytes) -> Any:
    """`raw` as JSON, strictly UTF-8 and encodable again; InvalidParameterError otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameterError("the request body is not valid UTF-8") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidParameterError("the request body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and an integer over the digit limit
        if isinstance(exc, json.JSONDecodeError):
            raise InvalidParameterError("the request body is not valid JSON") from None
        raise InvalidParameterError(f"the request body has an invalid number: {exc}") from None
    try:
        lone = _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(data)
    except RecursionError:
        raise InvalidParameterError("the request body is nested too deeply") from None
    if lone:
        raise InvalidParameterError("the request body has a lone UTF-16 surrogate in a string")
    return data


async def parse_body(request: Request, schema: type[M]) -> M:
    """The request body as `schema`; malformed JSON or wrong types -> InvalidParameterError."""
    data = loads_json(await read_body(request))
    if not isinstance(data, dict):
        raise InvalidParameterError("the request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        param = loc[0] if loc else None
        where = ".".join(loc)
        raise InvalidParameterError(f"{where}: {first.get('msg')}", param=param) from None
    except RecursionError:
        raise InvalidParameterError("the request body is nested too deeply") from None
