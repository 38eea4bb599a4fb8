"""Wiring: AdminServices from settings, and the standalone app for `cloister admin serve`."""

from __future__ import annotations

import secrets

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

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
