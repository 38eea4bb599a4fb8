"""Parse a JSON body into a schema after authentication, mapping every failure to a 400."""

from __future__ import annotations

import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidParameterError

MAX_BODY_BYTES = 8 * 1024 * 1024
M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, schema: type[M]) -> M:
    """The request body as `schema`; malformed JSON or wrong types -> InvalidParameterError."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise InvalidParameterError("the request body is too large", code="body_too_large")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidParameterError("the request body is not valid JSON") from None
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
