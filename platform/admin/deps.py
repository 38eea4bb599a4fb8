"""Request context for the admin API: authentication, role checks, tenant scoping, auditing.

Authorization rules (the matrix the tests walk):
    admin         everything
    viewer        every read (GET); no writes; secrets are never readable by anyone
    tenant-admin  reads of its own tenant, its keys (create, revoke), usage and billing;
                  another tenant's resources are 404 (existence is not revealed);
                  everything else is 403
Every denial (401/403/404) and every write is recorded in the audit log, and so is
every unexpected (500) error. Denials are aggregated per source and window (see
admin/audit_writer.py); no request waits for an audit write or holds a second
database connection for one. A source that sends `auth_failure_limit` bad
credentials within `auth_failure_window_s` gets 429 with Retry-After, before any
database read, until its window ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session, sessionmaker

from admin.audit_log import AuditLog
from admin.audit_writer import AuditWriter
from admin.errors import Unauthenticated
from admin.identity import AdminIdentity, Role, authenticate_admin
from admin.settings import AdminSettings
from server.request_ids import REQUEST_ID_HEADER, request_ids_of, valid_client_id
from tenancy.auth_throttle import FailureThrottle
from tenancy.errors import AuthThrottledError


@dataclass(frozen=True)
class AdminServices:
    """What the admin router needs; built once by the app factory.

    `audit` reads, verifies and exports the log; request paths write through
    `audit_writer` (non-blocking). `throttle` counts bad credentials per source.
    """

    sessions: sessionmaker[Session]
    pepper: str
    settings: AdminSettings
    audit: AuditLog
    session_key: str  # signs session tokens and the sign-in cookie; never the pepper
    audit_writer: AuditWriter
    throttle: FailureThrottle


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
        """Records an action of this caller (queued: never waits for the database)."""
        record_request(
            self.services.audit_writer,
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
        """Audits the denial (aggregated per source and window) and raises the HTTP error."""
        path = self.request.url.path
        self.services.audit_writer.denied(
            source=client_ip(self.request),
            actor=self.identity.actor,
            role=self.identity.role,
            outcome=f"denied:{status}",
            action=f"{self.request.method} {path}",
            resource="admin",
            reason=message,
            tenant_id=self.identity.tenant_id,
        )
        raise HTTPException(status, message)


def client_ip(request: Request) -> str | None:
    """The peer address of `request` (the source denials are counted by)."""
    return request.client.host if request.client else None


def _request_id(request: Request) -> str | None:
    """The id the response names (x-request-id): the client's if valid, else the server's."""
    ids = request_ids_of(request)
    if ids is not None:
        return ids.echoed
    return valid_client_id(request.headers.get(REQUEST_ID_HEADER))


def record_request(
    audit: AuditLog | AuditWriter,
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
        source_ip=client_ip(request),
        request_id=_request_id(request),
        detail=detail or None,
    )


def context_dependency(services: AdminServices) -> Any:
    """A FastAPI dependency yielding an AdminContext; 429 for a throttled source, 401 for
    a bad credential (both audited in aggregate); an unexpected error is audited as 500."""

    async def throttled(request: Request) -> None:
        # Async: a refused flood takes no worker thread and no database connection.
        try:
            services.throttle.check(client_ip(request))
        except AuthThrottledError as exc:
            _denied(services, request, "denied:429", "throttled")
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            raise HTTPException(429, str(exc), headers={"Retry-After": retry}) from exc

    def dependency(request: Request, _: None = Depends(throttled)) -> Iterator[AdminContext]:
        with services.sessions() as session:
            try:
                identity = authenticate_admin(
                    session,
                    services.pepper,
                    request.headers.get("authorization"),
                    session_key=services.session_key,
                )
            except Unauthenticated as exc:
                session.close()  # its connection goes back before anything else happens
                services.throttle.failed(client_ip(request))
                _denied(services, request, "denied:401", str(exc))
                raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc
            except Exception:
                session.close()
                _errored(services, request, None)
                raise
            # End the credential read: its connection goes back to the pool, and a
            # handler checks one out again only if it uses the session.
            session.rollback()
            try:
                yield AdminContext(services, request, identity, session)
            except HTTPException:
                raise
            except Exception as exc:
                session.rollback()
                session.close()
                _errored(services, request, identity, type(exc).__name__)
                raise

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


def _denied(services: AdminServices, request: Request, outcome: str, reason: str) -> None:
    path = request.url.path
    services.audit_writer.denied(
        source=client_ip(request),
        actor="anonymous",
        role="none",
        outcome=outcome,
        action=f"{request.method} {path}",
        resource="admin",  # one window per source for the whole admin API; paths in detail
        reason=reason,
    )


def _errored(
    services: AdminServices,
    request: Request,
    identity: AdminIdentity | None,
    error: str = "error",
) -> None:
    path = request.url.path
    record_request(
        services.audit_writer,
        request,
        identity,
        f"{request.method} {path}",
        path,
        "error:500",
        None,
        {"error": error},
    )
