"""`cloister keys ...`: create (shown once), list and revoke API keys."""

from __future__ import annotations

import json
from typing import Any

import click

from cloister.cli_context import (
    InvalidArgument,
    echo_result,
    echo_table,
    json_option,
    storage_options,
)
from cloister.cli_db import open_session
from cloister.commands.cli_audit import audit_change
from cloister.commands.tenants import parse_models
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
        "metadata": key.key_metadata or {},
        "allowed_models": key.allowed_models,
        "created_at": iso(key.created_at),
        "expires_at": iso(key.expires_at),
        "revoked_at": iso(key.revoked_at),
        "last_used_at": iso(key.last_used_at),
        "status": store.key_status(key),
    }


def parse_metadata(values: tuple[str, ...]) -> dict[str, str] | None:
    """`("team=search", "env=prod")` -> a dict; the store checks sizes and contents."""
    metadata: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"--metadata takes KEY=VALUE, not {item!r}")
        if key.strip() in metadata:
            raise InvalidArgument(f"--metadata: {key.strip()!r} is given twice")
        metadata[key.strip()] = value
    return metadata or None


def metadata_text(metadata: dict[str, str]) -> str:
    """`env=prod,team=search` (or `-`), for the one-line listing."""
    return ",".join(f"{k}={v}" for k, v in sorted(metadata.items())) or "-"


@click.group("keys")
def keys() -> None:
    """Manage API keys."""


@keys.command("create")
@click.option("--tenant", "tenant_name", required=True, help="Tenant name.")
@click.option("--name", default=None, help="An alias for the key, shown in `keys list`.")
@click.option(
    "--metadata",
    "metadata_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="A label (repeatable; at most 16, values up to 256 characters; no secrets).",
)
@click.option("--models", default=None, help="Comma-separated models this key may use.")
@click.option("--expires-in-days", type=click.FloatRange(min=0, min_open=True), default=None)
@json_option
@storage_options
def create(
    tenant_name: str,
    name: str | None,
    metadata_items: tuple[str, ...],
    models: str | None,
    expires_in_days: float | None,
    as_json: bool,
) -> None:
    """Create a key and print it ONCE; only its hash is stored."""
    metadata = parse_metadata(metadata_items)
    with open_session() as (settings, session):
        created = store.create_key(
            session,
            tenant_name=tenant_name,
            pepper=settings.key_pepper.get_secret_value(),
            name=name,
            allowed_models=parse_models(models),
            expires_in_days=expires_in_days,
            metadata=metadata,
        )
        audit_change(
            session,
            settings,
            "key.create",
            f"tenants/{tenant_name}/keys",
            tenant_id=created.tenant_id,
            key_id=created.id,
            name=name,
            metadata=metadata,
        )
    if as_json:  # the rest of the key's fields: `keys list --json`
        click.echo(json.dumps({"id": created.id, "key": created.secret}))
    else:
        click.echo(f"key id: {created.id}")
        click.echo(f"key:    {created.secret}")
        click.echo("Store the key now: it cannot be shown again.", err=True)


@keys.command("list")
@click.option("--tenant", "tenant_name", required=True, help="Tenant name.")
@json_option
@storage_options
def list_(tenant_name: str, as_json: bool) -> None:
    """List a tenant's keys (prefixes, aliases and metadata; never a secret)."""
    with open_session() as (_settings, session):
        rows = [key_dict(k) for k in store.list_keys(session, tenant_name=tenant_name)]
    echo_table(
        rows,
        as_json,
        f"{'ID':<18} {'PREFIX':<14} {'NAME':<16} {'STATE':<8} {'EXPIRES':<25} METADATA",
        lambda r: (
            f"{r['id']:<18} {r['prefix']:<14} {r['name'] or '-':<16} {r['status']:<8} "
            f"{r['expires_at'] or 'never':<25} {metadata_text(r['metadata'])}"
        ),
    )


@keys.command("revoke")
@click.argument("key_id")
@json_option
@storage_options
def revoke(key_id: str, as_json: bool) -> None:
    """Revoke a key (takes effect within the refresh interval)."""
    with open_session() as (settings, session):
        key = store.revoke_key(session, key_id=key_id)
        audit_change(session, settings, "key.revoke", f"keys/{key_id}", tenant_id=key.tenant_id)
        data = key_dict(key)
    echo_result(data, as_json, lambda: f"revoked key {key.id} ({key.prefix})")


commands: list[click.Command] = [keys]
