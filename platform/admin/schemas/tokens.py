"""Admin API tokens: create, the public view (prefix only) and the one-time secret."""

from __future__ import annotations

from pydantic import BaseModel

from admin.roles import Role
from admin.schemas.common import IsoTime


class TokenCreate(BaseModel):
    """A new admin API token (the role is checked by the data function: 400)."""

    role: str
    tenant: str | None = None
    name: str | None = None


class TokenPublic(BaseModel):
    """An admin token by its prefix."""

    id: str
    name: str | None
    role: str
    tenant_id: str | None
    prefix: str
    created_at: IsoTime | None
    revoked_at: IsoTime | None


class TokenCreated(BaseModel):
    """A new admin token; `token` is in this response only and never stored."""

    id: str
    role: Role
    tenant_id: str | None
    token: str
