"""Wiring: AdminServices from settings, and the standalone app for `cloister admin serve`."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from admin.audit_chain import load_private_key
from admin.audit_log import AuditLog
from admin.audit_writer import AuditWriter
from admin.deps import AdminServices
from admin.openapi import install_admin_openapi
from admin.router import create_admin_router
from admin.settings import AdminSettings
from admin.ui import mount_console
from admin.usage_retention import PURGE_INTERVAL_S, UsageRetention
from gateway.errors import install_error_handlers
from server.request_ids import install_request_ids
from tenancy.auth_throttle import FailureThrottle
from tenancy.unique_ids import UniqueIds


def make_services(
    sessions: sessionmaker[Session],
    *,
    pepper: str,
    settings: AdminSettings,
    audit_sessions: sessionmaker[Session] | None = None,
) -> AdminServices:
    """AdminServices with an AuditLog signing with the configured key (if any).

    `sessions` serve the admin API's requests; `audit_sessions` (default: the same)
    the background audit writer, so that a busy admin pool never delays the audit.
    """
    key = settings.audit_signing_key
    audit = AuditLog(
        audit_sessions or sessions,
        signing_key=load_private_key(key.get_secret_value()) if key else None,
        checkpoint_every=settings.audit_checkpoint_every,
        checkpoint_interval_s=settings.audit_checkpoint_interval_s,
        head_path=settings.audit_head_path,
    )
    session_key = settings.session_key
    return AdminServices(
        sessions=sessions,
        pepper=pepper,
        settings=settings,
        audit=audit,
        session_key=session_key.get_secret_value() if session_key else secrets.token_hex(32),
        audit_writer=AuditWriter(audit, denial_window_s=settings.audit_denial_window_s),
        throttle=FailureThrottle(
            limit=settings.auth_failure_limit, window_s=settings.auth_failure_window_s
        ),
    )


def create_admin_app(services: AdminServices) -> FastAPI:
    """A FastAPI app serving the admin API and console (`cloister admin serve`)."""
    app = FastAPI(title="Cloister admin", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(create_admin_router(services))
    mount_console(app, services)  # the console at /admin and its extra API routes
    install_admin_openapi(app)  # at /admin/api/openapi.json, as in `cloister serve`
    install_request_ids(app, UniqueIds().next)  # x-request-id on every answer, as audited
    # The errors of `cloister serve`, where these routes usually run: one OpenAI-format
    # body and the same status for the same fault, whichever command serves them.
    install_error_handlers(app)
    return app


def with_audit_checkpoints(
    app: FastAPI, services: AdminServices, *, purge_interval_s: float = PURGE_INTERVAL_S
) -> FastAPI:
    """`app` whose lifespan runs the audit log's checkpoint timer and the purge of raw
    usage past `usage_retention_days` (audited) and, at shutdown, stops the purge,
    drains the audit writer's queue and then signs the head.

    In the lifespan, not after `uvicorn.run` returns: on SIGTERM uvicorn shuts the app
    down, then raises the signal again, and the process ends before any code after it.
    """
    inner = app.router.lifespan_context
    retention = UsageRetention(
        services.sessions,
        retention_days=services.settings.usage_retention_days,
        audit=services.audit_writer,
        interval_s=purge_interval_s,
    )

    def close() -> None:
        retention.close()  # its last purge's record is queued before the writer drains
        services.audit_writer.close()  # records queued before shutdown reach the log...
        services.audit.close()  # ...before the shutdown checkpoint signs its head

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            services.audit.start()
            retention.start()
            try:
                yield
            finally:
                await run_in_threadpool(close)

    app.router.lifespan_context = lifespan
    return app
