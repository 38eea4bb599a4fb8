"""Who is calling, sign-in results and the console's public options."""

from __future__ import annotations

from pydantic import BaseModel

from admin.roles import Role


class WhoAmI(BaseModel):
    """The caller's identity."""

    actor: str
    role: Role
    tenant_id: str | None


class SessionCreated(BaseModel):
    """A signed-in session; `token` goes in the Authorization header and is shown once."""

    token: str
    actor: str
    role: Role
    tenant_id: str | None


class ConsoleConfig(BaseModel):
    """Public sign-in options (no secrets)."""

    oidc: bool
