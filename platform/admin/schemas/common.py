"""Shapes every resource shares: times as ISO text, pages of items."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Generic, TypeVar

from pydantic import BaseModel, PlainSerializer, WithJsonSchema

T = TypeVar("T")


def _iso(value: dt.datetime) -> str:
    return value.isoformat()


# Python's isoformat ("+00:00"), as the API has always written times.
IsoTime = Annotated[
    dt.datetime,
    PlainSerializer(_iso, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class Page(BaseModel, Generic[T]):
    """One page of a listing and the total count."""

    items: list[T]
    total: int
    limit: int
    offset: int


class ItemList(BaseModel, Generic[T]):
    """A whole listing (no pagination) and its count."""

    items: list[T]
    total: int
