"""Request context for the admin API: authentication, role checks, tenant scoping, auditing.

Authorization rules (the matrix the tests walk):
    admin         everything
    viewer        every read (GET); no writes; secrets are never readable by anyone
    tenant-admin  reads of its own tenant, its keys (create, revoke), usage and billing;
                  another tenant's resources are 404 (existence is not revealed);
                  everything else is 403
Every denial (401/403) and every write is recorded in the audit log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request
from sqlalchemy.orm import Session, sessionmaker

from admin.audit_log import AuditLog
from admin.errors import Unauthenticated
from admin.identity import AdminIdentity, Role, authenticate_admin
from admin.settings import AdminSettings


@dataclass(frozen=True)
class AdminServices:
    """What the admin router needs; built once by the app factory."""

    sessions: sessionmaker[Session]
    pepper: str
    settings: AdminSettings
    audit: AuditLog
    session_key: str  # signs session tokens and the sign-in cookie; never the pepper


class AdminContext:
    """One authenticated admin request: its identity, a session, and audit helpers."""

    def __init__(
        self, services: AdminServices, request: Request, identity: AdminIdentity, session: Session
    ) -> None:
        self.services = services
        self.request = request
        self.identity = identity
        self.session = session

    def audit(
        self,
        action: str,
        resource: str,
        *,
        outcome: str = "success",
        tenant_id: str | None = None,
        **detail: Any,
    ) -> None:
        """Records an action of this caller."""
        record_request(
            self.services.audit,
            self.request,
            self.identity,
            action,
            resource,
            outcome,
            tenant_id,
            detail,
        )

    def require(self, *roles: Role) -> None:
        """403 (audited) unless the caller has one of `roles`."""
        if self.identity.role not in roles:
            self.deny(403, "forbidden for role " + self.identity.role)

    def require_tenant(self, tenant_id: str) -> None:
        """For tenant-admin: 404 (audited) unless `tenant_id` is its own."""
        if self.identity.role == "tenant-admin" and self.identity.tenant_id != tenant_id:
            self.deny(404, "not found")

    def deny(self, status: int, message: str) -> None:
        """Audits the denial and raises the HTTP error."""
        self.audit(
            f"{self.request.method} {self.request.url.path}",
            self.request.url.path,
            outcome=f"denied:{status}",
        )
        raise HTTPException(status, message)


def _client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


def record_request(
    audit: AuditLog,
    request: Request,
    identity: AdminIdentity | None,
    action: str,
    resource: str,
    outcome: str,
    tenant_id: str | None,
    detail: dict[str, Any] | None,
) -> None:
    """Appends one audit record for an HTTP request."""
    audit.record(
        actor=identity.actor if identity else "anonymous",
        role=identity.role if identity else "none",
        tenant_id=tenant_id
        if tenant_id is not None
        else (identity.tenant_id if identity else None),
        action=action,
        resource=resource,
        outcome=outcome,
        source_ip=_client_ip(request),
        request_id=request.headers.get("x-request-id"),
        detail=detail or None,
    )


def context_dependency(services: AdminServices) -> Any:
    """A FastAPI dependency yielding an AdminContext, or 401 (audited)."""

    def dependency(request: Request) -> Iterator[AdminContext]:
        with services.sessions() as session:
            try:
                identity = authenticate_admin(
                    session,
                    services.pepper,
                    request.headers.get("authorization"),
                    session_key=services.session_key,
                )
            except Unauthenticated as exc:
                path = request.url.path
                record_request(
                    services.audit,
                    request,
                    None,
                    f"{request.method} {path}",
                    path,
                    "denied:401",
                    None,
                    None,
                )
                raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc
            yield AdminContext(services, request, identity, session)

    return dependency


OPERATOR_ROLES: tuple[Role, ...] = ("admin", "viewer")


def operator_auth(services: AdminServices) -> Callable[[str], bool]:
    """The gateway's check for its tenant-labelled metrics: an admin or viewer credential.

    A tenant-admin sees only its own tenant, so it is no operator here.
    """

    def check(authorization: str) -> bool:
        with services.sessions() as session:
            try:
                identity = authenticate_admin(
                    session, services.pepper, authorization, session_key=services.session_key
                )
            except (Unauthenticated, ValueError, TypeError, KeyError):
                return False  # malformed credentials too: this check fails closed
        return identity.role in OPERATOR_ROLES

    return check
