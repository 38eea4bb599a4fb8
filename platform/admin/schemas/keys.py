"""A tenant's API keys: create, the public view (prefix only) and the one-time secret."""

from __future__ import annotations

from pydantic import BaseModel

from admin.schemas.common import IsoTime


class KeyCreate(BaseModel):
    """A new API key."""

    name: str | None = None
    allowed_models: list[str] | None = None
    expires_in_days: float | None = None


class KeyPublic(BaseModel):
    """A key by its display prefix; the hash stays in the database."""

    id: str
    tenant_id: str
    prefix: str
    name: str | None
    allowed_models: list[str] | None
    created_at: IsoTime | None
    expires_at: IsoTime | None
    revoked_at: IsoTime | None
    last_used_at: IsoTime | None
    status: str


class KeyCreated(BaseModel):
    """A new key; `secret` is in this response only and never stored."""

    id: str
    tenant_id: str
    prefix: str
    secret: str
