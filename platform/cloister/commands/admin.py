"""`cloister admin ...`: bootstrap admin tokens and serve the admin API alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from admin.roles import ROLES
from admin.settings import AdminSettings
from cloister.cli_context import echo_result, json_option, storage_options
from cloister.cli_db import session_factory
from server.settings import Settings


@contextmanager
def admin_context() -> Iterator[tuple[Settings, Any, Any]]:
    """(settings, session factory, AdminSettings) on the migrated configured database."""
    with session_factory() as (settings, sessions):
        yield settings, sessions, AdminSettings.from_settings(settings)


@click.group("admin")
def admin() -> None:
    """The admin service: tokens and a standalone server."""


@admin.command("create-token")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--tenant", default=None, help="Tenant name (tenant-admin only).")
@click.option("--name", default=None, help="A label for the token.")
@json_option
@storage_options
def create_token(role: str, tenant: str | None, name: str | None, as_json: bool) -> None:
    """Create an admin API token; the secret is printed once."""
    from admin.identity import create_admin_token
    from cloister.commands.cli_audit import audit_change

    with admin_context() as (settings, sessions, _admin), sessions() as session:
        created = create_admin_token(
            session,
            pepper=settings.key_pepper.get_secret_value(),
            role=role,
            tenant_name=tenant,
            name=name,
        )
        audit_change(
            session,
            settings,
            "token.create",
            f"tokens/{role}",
            tenant_id=created.tenant_id,
            id=created.id,  # (a field named *token* would be scrubbed as a secret)
        )
    data = {
        "id": created.id,
        "token": created.secret,
        "role": role,
        "tenant_id": created.tenant_id,
        "name": name,
    }
    echo_result(data, as_json, lambda: f"created {role} token {created.id}:\n{created.secret}")


@admin.command("revoke-token")
@click.argument("token_id")
@json_option
@storage_options
def revoke_token(token_id: str, as_json: bool) -> None:
    """Revoke an admin API token by id."""
    from admin.identity import revoke_admin_token
    from cloister.commands.cli_audit import audit_change

    with admin_context() as (settings, sessions, _admin), sessions() as session:
        row = revoke_admin_token(session, token_id=token_id)
        audit_change(
            session, settings, "token.revoke", f"tokens/{token_id}", tenant_id=row.tenant_id
        )
    data = {"id": token_id, "revoked": True, "tenant_id": row.tenant_id}
    echo_result(data, as_json, lambda: f"revoked {token_id}")


@admin.command("serve")
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@storage_options
def serve(host: str | None, port: int | None) -> None:
    """Serve only the admin API (/admin/api/v1)."""
    import uvicorn

    from admin.app import create_admin_app, make_services, with_audit_checkpoints

    with admin_context() as (settings, sessions, admin_settings):
        services = make_services(
            sessions, pepper=settings.key_pepper.get_secret_value(), settings=admin_settings
        )
        uvicorn.run(
            with_audit_checkpoints(create_admin_app(services), services),
            host=host or settings.host,
            port=port or settings.port,
            log_config=None,
            **settings.proxy_header_options(),
        )


commands: list[click.Command] = [admin]
