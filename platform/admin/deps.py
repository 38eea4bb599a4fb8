"""Request context for the admin API: services, authentication, role checks, tenant scoping,
writes and their audit records. The dependency aliases here are what every route uses.

Who may do what is admin/roles.py; a route declares it with `dependencies=[allow(...)]`.
A tenant-admin is pinned to its own tenant: another tenant's resources are 404
(existence is not revealed). Every denial (401/403/404) and every write is recorded in
the audit log, and so is every unexpected (500) error. Denials are aggregated per
source and window (see admin/audit_writer.py); no request waits for an audit write or
holds a second database connection for one. A source that sends `auth_failure_limit`
bad credentials within `auth_failure_window_s` gets 429 with Retry-After, before any
database read, until its window ends.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.params import Depends as DependsParam
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from admin.audit_log import AuditLog
from admin.audit_writer import AuditWriter
from admin.errors import Unauthenticated
from admin.identity import AdminIdentity, authenticate_admin
from admin.roles import OPERATOR_ROLES, Role
from admin.settings import AdminSettings
from admin.source_paths import SourcePathError, check_source
from admin.upload_intake import UploadSlots
from server.request_ids import REQUEST_ID_HEADER, request_ids_of, valid_client_id
from tenancy import store
from tenancy.auth_throttle import FailureThrottle
from tenancy.errors import (
    AuthThrottledError,
    ConflictError,
    NotFoundError,
    TenancyError,
)
from tenancy.models import Tenant

T = TypeVar("T")
Public = TypeVar("Public", bound=BaseModel)
Detail = Mapping[str, object]
UPLOAD_CONCURRENCY = 2  # adapter uploads received and validated at once


@dataclass(frozen=True)
class AdminServices:
    """What the admin routes need; built once by the app factory (a lifespan object).

    `audit` reads, verifies and exports the log; request paths write through
    `audit_writer` (non-blocking). `throttle` counts bad credentials per source;
    `upload_slots` bounds the adapter uploads in flight.
    """

    sessions: sessionmaker[Session]
    pepper: str
    settings: AdminSettings
    audit: AuditLog
    session_key: str  # signs session tokens and the sign-in cookie; never the pepper
    audit_writer: AuditWriter
    throttle: FailureThrottle
    upload_slots: UploadSlots = field(default_factory=lambda: UploadSlots(UPLOAD_CONCURRENCY))


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
        detail: Detail | None = None,
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

    def write(
        self,
        action: str,
        resource: str,
        fn: Callable[[], T],
        *,
        tenant_id: str | None = None,
        detail: Detail | Callable[[T], Detail] | None = None,
    ) -> T:
        """Runs a write; audits it (an error too) and maps a tenancy error to HTTP once.

        `detail` may be a function of the result (what changed, known only after it).
        """
        try:
            result = fn()
        except TenancyError as exc:
            self.session.rollback()
            self.audit(action, resource, outcome="error", tenant_id=tenant_id)
            raise http_error(exc) from exc
        self.audit(
            action,
            resource,
            tenant_id=tenant_id,
            detail=detail(result) if callable(detail) else detail,
        )
        return result

    def write_new(
        self, action: str, resource: str, fn: Callable[[], T], public: Callable[[T], Public]
    ) -> Public:
        """`write`s a creation audited with the new thing's public form ("after"), and
        returns that form."""
        created = self.write(
            action, resource, fn, detail=lambda r: {"after": public(r).model_dump(mode="json")}
        )
        return public(created)

    def check_source(self, source: str, action: str, resource: str) -> None:
        """400 unless `source` may be registered (admin/source_paths.py: under the model
        roots, regular files only); the refusal is audited as an invalid `action`, like
        any refused write, since it never reaches `write`."""
        try:
            check_source(source, self.services.settings.model_roots)
        except SourcePathError as exc:
            self.audit(action, resource, outcome="invalid")
            raise HTTPException(400, str(exc)) from exc

    def require(self, *roles: Role) -> None:
        """403 (audited) unless the caller has one of `roles`."""
        if self.identity.role not in roles:
            self.deny(403, "forbidden for role " + self.identity.role)

    def require_tenant(self, tenant_id: str) -> None:
        """For tenant-admin: 404 (audited) unless `tenant_id` is its own."""
        if self.identity.role == "tenant-admin" and self.identity.tenant_id != tenant_id:
            self.deny(404, "not found")

    def scoped_tenant(self, tenant_id: str | None) -> str | None:
        """The tenant filter to apply: a tenant-admin is pinned to its own tenant."""
        if self.identity.role != "tenant-admin":
            return tenant_id
        if tenant_id is not None and tenant_id != self.identity.tenant_id:
            self.deny(404, "not found")
        return str(self.identity.tenant_id)

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


def http_error(exc: TenancyError) -> HTTPException:
    """The HTTP error for a refused data-function call: 404, 409, else a bad value (400)."""
    if isinstance(exc, NotFoundError):
        return HTTPException(404, str(exc))
    if isinstance(exc, ConflictError):
        return HTTPException(409, str(exc))
    return HTTPException(400, str(exc))


def request_id(request: Request) -> str:
    """This request's id as its response names it (`x-request-id`): the caller's valid id,
    else the server's (server.request_ids' middleware, which sends the header). Without
    that middleware, the caller's valid id or one made here."""
    ids = request_ids_of(request)
    if ids is not None:
        return ids.echoed
    rid: str | None = getattr(request.state, "admin_request_id", None)
    if rid is None:
        rid = valid_client_id(request.headers.get(REQUEST_ID_HEADER)) or (
            "adm-" + secrets.token_hex(12)
        )
        request.state.admin_request_id = rid
    return rid


def client_ip(request: Request) -> str | None:
    """The peer address of `request` (the source denials are counted by)."""
    return request.client.host if request.client else None


def record_request(
    audit: AuditLog | AuditWriter,
    request: Request,
    identity: AdminIdentity | None,
    action: str,
    resource: str,
    outcome: str,
    tenant_id: str | None,
    detail: Detail | None,
) -> None:
    """Appends one audit record for an HTTP request: who (id and name), which request."""
    audit.record(
        actor=identity.actor if identity else "anonymous",
        actor_name=identity.name if identity else None,
        role=identity.role if identity else "none",
        tenant_id=tenant_id
        if tenant_id is not None
        else (identity.tenant_id if identity else None),
        action=action,
        resource=resource,
        outcome=outcome,
        source_ip=client_ip(request),
        request_id=request_id(request),
        detail=dict(detail) if detail else None,
    )


# -- binding and the dependency aliases ------------------------------------------------


def bind_services(services: AdminServices) -> DependsParam:
    """A router dependency that makes `services` this request's (see get_services)."""

    def bind(request: Request) -> None:
        request.state.admin_services = services

    dependency: DependsParam = Depends(bind)
    return dependency


def refuse_nul_characters(request: Request) -> None:
    """A 400 for a NUL in the path or query: names there are looked up in the database,
    and PostgreSQL refuses any text holding one (a 500, found by fuzzing the admin API
    on PostgreSQL; SQLite takes them)."""
    if "\x00" in request.scope["path"] or b"%00" in request.scope.get("query_string", b""):
        raise HTTPException(400, "the path and query may not contain NUL characters (%00)")


def get_services(request: Request) -> AdminServices:
    """The services the admin router was built with (bound by `bind_services`)."""
    services: AdminServices = request.state.admin_services
    return services


ServicesDep = Annotated[AdminServices, Depends(get_services)]


async def throttled(request: Request, services: ServicesDep) -> None:
    """429 (audited in aggregate) for a source that sent too many bad credentials.

    Async: a refused flood takes no worker thread and no database connection.
    """
    try:
        services.throttle.check(client_ip(request))
    except AuthThrottledError as exc:
        _denied(services, request, "denied:429", "throttled")
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        raise HTTPException(429, str(exc), headers={"Retry-After": retry}) from exc


def get_context(
    request: Request,
    services: ServicesDep,
    _: Annotated[None, Depends(throttled)],
) -> Iterator[AdminContext]:
    """The AdminContext of an authenticated request; 401 (audited in aggregate) for a bad
    credential; an unexpected error is audited as 500."""
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


Ctx = Annotated[AdminContext, Depends(get_context)]


def allow(roles: tuple[Role, ...]) -> DependsParam:
    """A route dependency: 403 (audited) unless the caller has one of `roles`.

    It runs before the body is validated, so a caller without the role learns nothing
    of the body's shape. The handler's `Ctx` is the same instance (FastAPI caches it).
    """

    def check(ctx: Ctx) -> None:
        ctx.require(*roles)

    dependency: DependsParam = Depends(check)
    return dependency


def path_tenant(ctx: Ctx, name: str) -> Tenant:
    """The tenant named in the path; 404 for a missing one or (to a tenant-admin) another's."""
    try:
        tenant = store.get_tenant(ctx.session, name)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc
    ctx.require_tenant(tenant.id)
    return tenant


PathTenant = Annotated[Tenant, Depends(path_tenant)]


def operator_auth(services: AdminServices) -> Callable[[str], bool]:
    """The gateway's check for its tenant-labelled metrics: a platform-wide credential.

    A tenant-admin sees only its own tenant, so it is no operator here; nor are finance
    and auditor, whose business is billing and the audit log.
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
