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
from admin.deps import AdminServices
from admin.router import create_admin_router
from admin.settings import AdminSettings
from admin.ui import mount_console


def make_services(
    sessions: sessionmaker[Session], *, pepper: str, settings: AdminSettings
) -> AdminServices:
    """AdminServices with an AuditLog signing with the configured key (if any)."""
    key = settings.audit_signing_key
    audit = AuditLog(
        sessions,
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
    )


def create_admin_app(services: AdminServices) -> FastAPI:
    """A FastAPI app serving the admin API and console (`cloister admin serve`)."""
    app = FastAPI(title="Cloister admin", docs_url=None, redoc_url=None)
    app.include_router(create_admin_router(services))
    mount_console(app, services)  # the console at /admin and its extra API routes
    return app


def with_audit_checkpoints(app: FastAPI, audit: AuditLog) -> FastAPI:
    """`app` whose lifespan runs the audit log's checkpoint timer and, at shutdown, signs
    the head.

    In the lifespan, not after `uvicorn.run` returns: on SIGTERM uvicorn shuts the app
    down, then raises the signal again, and the process ends before any code after it.
    """
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            audit.start()
            try:
                yield
            finally:
                await run_in_threadpool(audit.close)

    app.router.lifespan_context = lifespan
    return app
