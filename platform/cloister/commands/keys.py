"""`cloister keys ...`: create (shown once), list and revoke API keys."""

from __future__ import annotations

import json
from typing import Any

import click

from cloister.commands.cli_audit import audit_change
from cloister.commands.tenants import open_session, parse_models
from server.settings import Settings
from tenancy import store
from tenancy.models import ApiKey


def key_dict(key: ApiKey) -> dict[str, Any]:
    """A key's public fields (never the hash)."""

    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": key.id,
        "tenant_id": key.tenant_id,
        "prefix": key.prefix,
        "name": key.name,
        "allowed_models": key.allowed_models,
        "created_at": iso(key.created_at),
        "expires_at": iso(key.expires_at),
        "revoked_at": iso(key.revoked_at),
        "last_used_at": iso(key.last_used_at),
        "status": store.key_status(key),
    }


@click.group("keys")
def keys() -> None:
    """Manage API keys."""


@keys.command("create")
@click.option("--tenant", "tenant_name", required=True, help="Tenant name.")
@click.option("--name", default=None, help="A label for the key.")
@click.option("--models", default=None, help="Comma-separated models this key may use.")
@click.option("--expires-in-days", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def create(
    tenant_name: str,
    name: str | None,
    models: str | None,
    expires_in_days: float | None,
    as_json: bool,
) -> None:
    """Create a key and print it ONCE; only its hash is stored."""
    pepper = Settings().key_pepper.get_secret_value()
    with open_session() as session:
        created = store.create_key(
            session,
            tenant_name=tenant_name,
            pepper=pepper,
            name=name,
            allowed_models=parse_models(models),
            expires_in_days=expires_in_days,
        )
        audit_change(
            session,
            "key.create",
            f"tenants/{tenant_name}/keys",
            tenant_id=created.tenant_id,
            key_id=created.id,
        )
    if as_json:
        click.echo(json.dumps({"id": created.id, "key": created.secret}))
    else:
        click.echo(f"key id: {created.id}")
        click.echo(f"key:    {created.secret}")
        click.echo("Store the key now: it cannot be shown again.", err=True)


@keys.command("list")
@click.option("--tenant", "tenant_name", required=True, help="Tenant name.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(tenant_name: str, as_json: bool) -> None:
    """List a tenant's keys (prefixes only)."""
    with open_session() as session:
        rows = [key_dict(k) for k in store.list_keys(session, tenant_name=tenant_name)]
    if as_json:
        click.echo(json.dumps(rows, sort_keys=True))
        return
    click.echo(f"{'ID':<18} {'PREFIX':<14} {'NAME':<16} {'STATE':<8} EXPIRES")
    for r in rows:
        click.echo(
            f"{r['id']:<18} {r['prefix']:<14} {r['name'] or '-':<16} {r['status']:<8} "
            f"{r['expires_at'] or 'never'}"
        )


@keys.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key (takes effect within the refresh interval)."""
    with open_session() as session:
        key = store.revoke_key(session, key_id=key_id)
        audit_change(session, "key.revoke", f"keys/{key_id}", tenant_id=key.tenant_id)
        click.echo(f"revoked key {key.id} ({key.prefix})")


commands: list[click.Command] = [keys]
