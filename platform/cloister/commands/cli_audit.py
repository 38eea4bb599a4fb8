"""Audit records for changes made with the CLI; the actor is `cli:<os user>`."""

from __future__ import annotations

import getpass
import os
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from admin.settings import AdminSettings
from server.settings import Settings


def cli_actor() -> str:
    """`cli:<os user>` (the uid when the user has no name, e.g. in a bare container)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = str(os.getuid())
    return f"cli:{user}"


def audit_change(
    session: Session,
    settings: Settings,
    action: str,
    resource: str,
    *,
    tenant_id: str | None = None,
    outcome: str = "success",
    **detail: Any,
) -> None:
    """Appends one record of a CLI change, on the database `session` is bound to, signed
    with the audit key of `settings` (the invocation's own, flags included).

    Written synchronously after the change committed: a CLI command is one
    change, and it reports success only once the change is audited.
    """
    from admin.audit_chain import load_private_key
    from admin.audit_log import AuditLog

    admin_settings = AdminSettings.from_settings(settings)
    key = admin_settings.audit_signing_key
    log = AuditLog(
        sessionmaker(bind=session.get_bind(), expire_on_commit=False),
        signing_key=load_private_key(key.get_secret_value()) if key else None,
        checkpoint_every=admin_settings.audit_checkpoint_every,
    )
    log.record(
        actor=cli_actor(),
        role="cli",
        action=action,
        resource=resource,
        outcome=outcome,
        tenant_id=tenant_id,
        detail=detail or None,
    )
