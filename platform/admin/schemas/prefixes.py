"""Shared prefixes: publish, and the public view."""

from __future__ import annotations

from pydantic import BaseModel

from admin.schemas.common import IsoTime


class PrefixCreate(BaseModel):
    """A shared prefix: token ids or text."""

    name: str
    model: str
    token_ids: list[int] | None = None
    text: str | None = None


class PrefixPublic(BaseModel):
    """A published shared prefix."""

    id: str
    name: str
    model: str
    token_ids: list[int] | None
    text: str | None
    created_at: IsoTime | None
