"""`cloister admin ...`: bootstrap admin tokens and serve the admin API alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from admin.roles import ROLES
from server.settings import Settings, private_data_dir


@contextmanager
def admin_context() -> Iterator[tuple[Settings, Any, Any]]:
    """(settings, session factory, AdminSettings) on the migrated configured database."""

    from tenancy.db import make_engine, make_session_factory, upgrade_database

    settings = Settings()
    url = settings.resolved_database_url
    private_data_dir(settings.data_dir)
    upgrade_database(url)
    engine = make_engine(url)
    try:
        yield settings, make_session_factory(engine), settings.admin_settings()
    finally:
        engine.dispose()


@click.group("admin")
def admin() -> None:
    """The admin service: tokens and a standalone server."""


@admin.command("create-token")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--tenant", default=None, help="Tenant name (tenant-admin only).")
@click.option("--name", default=None, help="A label for the token.")
@click.option("--json", "as_json", is_flag=True, help='Print {"token": "..."}.')
def create_token(role: str, tenant: str | None, name: str | None, as_json: bool) -> None:
    """Create an admin API token; the secret is printed once."""
    from admin.identity import create_admin_token
    from cloister.commands.cli_audit import audit_change
    from tenancy.errors import TenancyError

    with admin_context() as (settings, sessions, _admin), sessions() as session:
        try:
            created = create_admin_token(
                session,
                pepper=settings.key_pepper.get_secret_value(),
                role=role,
                tenant_name=tenant,
                name=name,
            )
        except TenancyError as exc:
            raise click.ClickException(str(exc)) from exc
        audit_change(
            session,
            "token.create",
            f"tokens/{role}",
            tenant_id=created.tenant_id,
            id=created.id,  # (a field named *token* would be scrubbed as a secret)
        )
    if as_json:
        click.echo(json.dumps({"token": created.secret}))
    else:
        click.echo(f"created {role} token {created.id}:\n{created.secret}")


@admin.command("revoke-token")
@click.argument("token_id")
def revoke_token(token_id: str) -> None:
    """Revoke an admin API token by id."""
    from admin.identity import revoke_admin_token
    from cloister.commands.cli_audit import audit_change
    from tenancy.errors import TenancyError

    with admin_context() as (_settings, sessions, _admin), sessions() as session:
        try:
            row = revoke_admin_token(session, token_id=token_id)
        except TenancyError as exc:
            raise click.ClickException(str(exc)) from exc
        audit_change(session, "token.revoke", f"tokens/{token_id}", tenant_id=row.tenant_id)
    click.echo(f"revoked {token_id}")


@admin.command("serve")
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
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
        )


commands: list[click.Command] = [admin]
