"""`cloister tenants ...`: create, list, limit, update, suspend, resume and delete tenants."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click

from cloister.cli_context import (
    CLEAR,
    Cleared,
    InvalidArgument,
    NoneOr,
    echo_result,
    echo_table,
    json_option,
    storage_options,
)
from cloister.cli_db import open_session
from cloister.commands.cli_audit import audit_change
from server.field_copy import attrs_dict
from tenancy import store
from tenancy.limits import EffectiveLimits
from tenancy.models import Tenant


def parse_models(value: str | None) -> list[str] | None:
    """ "a,b" -> ["a", "b"]; None stays None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise click.BadParameter("give comma-separated model names", param_hint="--models")
    models = [m.strip() for m in value.split(",") if m.strip()]
    if not models:
        raise click.BadParameter("give at least one model name", param_hint="--models")
    return models


_TENANT_FIELDS = (
    "id",
    "name",
    "status",
    "deleted_at",
    "isolation_level",
    "weight",
    "cache_floor_blocks",
    "cache_floor_share",
    "retention_ttl_s",
    "scrub_on_free",
    "never_cache",
    "kv_quota_blocks",
    "stream_cadence",
    "created_at",
)


def tenant_dict(tenant: Tenant) -> dict[str, Any]:
    """A tenant as JSON-ready values."""
    return attrs_dict(
        tenant,
        _TENANT_FIELDS,
        # A deleted tenant is stored suspended; people and scripts see "deleted".
        status="deleted" if tenant.deleted_at is not None else tenant.status,
        deleted_at=tenant.deleted_at.isoformat() if tenant.deleted_at else None,
        never_cache=bool(tenant.never_cache),
        created_at=tenant.created_at.isoformat(),
    )


def limits_dict(limits: EffectiveLimits) -> dict[str, Any]:
    """Limits as JSON-ready values (None: unlimited)."""
    out = dataclasses.asdict(limits)
    out["allowed_models"] = sorted(limits.allowed_models) if limits.allowed_models else None
    out["key_scoped"] = sorted(limits.key_scoped)
    return out


STREAM_CADENCE_HELP = (
    'How streamed text is chunked: "token" (as the engine emits it) or "fixed:N" '
    "(N tokens a chunk, 1 to 64), which hides how many tokens each engine step produced."
)


@click.group("tenants")
def tenants() -> None:
    """Manage tenants and their limits."""


@tenants.command("create")
@click.argument("name")
@click.option("--isolation", type=click.Choice(["tenant", "key", "user"]), default="tenant")
@click.option("--weight", type=float, default=1.0, show_default=True)
@click.option(
    "--stream-cadence",
    default="token",
    show_default=True,
    help=STREAM_CADENCE_HELP,
)
@json_option
@storage_options
def create(name: str, isolation: str, weight: float, stream_cadence: str, as_json: bool) -> None:
    """Create a tenant."""
    with open_session() as (settings, session):
        tenant = store.create_tenant(
            session,
            name=name,
            isolation_level=isolation,
            weight=weight,
            stream_cadence=stream_cadence,
        )
        audit_change(
            session,
            settings,
            "tenant.create",
            f"tenants/{name}",
            tenant_id=tenant.id,
            isolation_level=isolation,
            weight=weight,
            stream_cadence=tenant.stream_cadence,
        )
        echo_result(
            tenant_dict(tenant), as_json, lambda: f"created tenant {tenant.name} ({tenant.id})"
        )


@tenants.command("list")
@click.option("--all", "include_deleted", is_flag=True, help="Deleted tenants too.")
@json_option
@storage_options
def list_(include_deleted: bool, as_json: bool) -> None:
    """List tenants (not the deleted ones, unless --all)."""
    with open_session() as (_settings, session):
        found = store.list_tenants(session, include_deleted=include_deleted)
        rows = [tenant_dict(t) for t in found]
    echo_table(
        rows,
        as_json,
        f"{'ID':<18} {'NAME':<24} {'STATUS':<10} {'ISOLATION':<10} WEIGHT",
        lambda r: (
            f"{r['id']:<18} {r['name']:<24} {r['status']:<10} {r['isolation_level']:<10} "
            f"{r['weight']:g}"
        ),
    )


COUNT = NoneOr(click.IntRange(min=0))
POSITIVE = NoneOr(click.IntRange(min=1))


@tenants.command("set-limits")
@click.argument("name")
@click.option("--rpm", type=COUNT, help="Requests per minute.")
@click.option("--tpm", type=COUNT, help="Tokens per minute.")
@click.option("--concurrency", type=COUNT, help="Concurrent requests.")
@click.option("--budget", type=COUNT, help="Token budget per period.")
@click.option("--budget-period", type=NoneOr(click.Choice(["day", "month"])))
@click.option("--max-output-tokens", type=POSITIVE)
@click.option("--max-prompt-tokens", type=POSITIVE)
@click.option(
    "--max-tokens-in-flight",
    type=POSITIVE,
    help="Prompt + max output tokens of the tenant's requests in flight at once.",
)
@click.option("--models", type=NoneOr(click.STRING), help="Comma-separated allowed models.")
@json_option
@storage_options
def set_limits(name: str, as_json: bool, **options: Any) -> None:
    """Set a tenant's limits (only the options given change; `none` clears one: unlimited)
    and print those in force."""
    if options["budget_period"] not in (None, CLEAR) and options["budget"] in (None, CLEAR):
        raise click.BadParameter("needs --budget", param_hint="--budget-period")
    models = options["models"]
    given: dict[str, Any] = {
        "rpm": options["rpm"],
        "tpm": options["tpm"],
        "max_concurrent": options["concurrency"],
        "token_budget": options["budget"],
        "budget_period": options["budget_period"],
        "max_output_tokens": options["max_output_tokens"],
        "max_prompt_tokens": options["max_prompt_tokens"],
        "max_tokens_in_flight": options["max_tokens_in_flight"],
        "allowed_models": models if models in (None, CLEAR) else parse_models(models),
    }
    changed: dict[str, Any] = {
        k: None if v is CLEAR else v for k, v in given.items() if v is not None
    }
    with open_session() as (settings, session):
        limits = store.set_limits(session, tenant_name=name, **changed)
        tenant = store.get_tenant(session, name)
        audit_change(
            session,
            settings,
            "limits.set",
            f"tenants/{name}/limits",
            tenant_id=tenant.id,
            **changed,
        )
    data = limits_dict(limits)

    def text() -> str:
        return "\n".join(
            f"{k}: {'unlimited' if v is None else v}" for k, v in data.items() if k != "key_scoped"
        )

    echo_result(data, as_json, text)


@tenants.command("update")
@click.argument("name")
@click.option("--weight", type=float, help="Scheduling weight (0.01 to 100).")
@click.option(
    "--cache-floor-blocks", type=NoneOr(click.INT), help="KV blocks kept for this tenant's cache."
)
@click.option(
    "--cache-floor-share", type=NoneOr(click.FLOAT), help="Share of the KV pool kept (0 to 1)."
)
@click.option("--no-cache-floor", is_flag=True, help="Remove the cache floor.")
@click.option(
    "--retention-ttl-s",
    type=NoneOr(click.FLOAT),
    help="Seconds a freed cached block is kept (none: the engine's TTL).",
)
@click.option("--default-retention-ttl", is_flag=True, help="Back to the engine's TTL.")
@click.option(
    "--scrub-on-free/--no-scrub-on-free",
    default=None,
    help="Zero this tenant's KV blocks when they are freed.",
)
@click.option("--default-scrub", is_flag=True, help="Back to the engine's scrub setting.")
@click.option("--never-cache/--cache", default=None, help="Never read or write the prefix cache.")
@click.option(
    "--kv-quota-blocks",
    type=NoneOr(click.INT),
    help="Most KV blocks this tenant's running sequences may hold (none: no quota).",
)
@click.option("--no-kv-quota", is_flag=True, help="Remove the KV quota.")
@click.option("--stream-cadence", help=STREAM_CADENCE_HELP)
@json_option
@storage_options
def update(
    name: str,
    weight: float | None,
    cache_floor_blocks: int | Cleared | None,
    cache_floor_share: float | Cleared | None,
    no_cache_floor: bool,
    retention_ttl_s: float | Cleared | None,
    default_retention_ttl: bool,
    scrub_on_free: bool | None,
    default_scrub: bool,
    never_cache: bool | None,
    kv_quota_blocks: int | Cleared | None,
    no_kv_quota: bool,
    stream_cadence: str | None,
    as_json: bool,
) -> None:
    """Change a tenant's weight, cache policy, KV quota and stream cadence (only the
    options given change; `none` clears a floor, TTL or quota); the running server applies
    it within its refresh interval."""
    _exclusive(
        ("--no-cache-floor", no_cache_floor),
        ("--cache-floor-blocks", cache_floor_blocks is not None),
        ("--cache-floor-share", cache_floor_share is not None),
    )
    _exclusive(
        ("--default-retention-ttl", default_retention_ttl),
        ("--retention-ttl-s", retention_ttl_s is not None),
    )
    _exclusive(("--default-scrub", default_scrub), ("--scrub-on-free", scrub_on_free is not None))
    _exclusive(("--no-kv-quota", no_kv_quota), ("--kv-quota-blocks", kv_quota_blocks is not None))
    given: dict[str, Any] = {
        "weight": weight,
        "cache_floor_blocks": cache_floor_blocks,
        "cache_floor_share": cache_floor_share,
        "retention_ttl_s": retention_ttl_s,
        "scrub_on_free": scrub_on_free,
        "never_cache": never_cache,
        "kv_quota_blocks": kv_quota_blocks,
        "stream_cadence": stream_cadence,
    }
    changed: dict[str, Any] = {
        k: None if v is CLEAR else v for k, v in given.items() if v is not None
    }
    if no_cache_floor:
        changed.update(cache_floor_blocks=None, cache_floor_share=None)
    if default_retention_ttl:
        changed["retention_ttl_s"] = None
    if default_scrub:
        changed["scrub_on_free"] = None
    if no_kv_quota:
        changed["kv_quota_blocks"] = None
    if not changed:
        raise InvalidArgument("nothing to change: give at least one option")
    with open_session() as (settings, session):
        tenant = store.update_tenant(session, name=name, **changed)
        audit_change(
            session, settings, "tenant.update", f"tenants/{name}", tenant_id=tenant.id, **changed
        )
        echo_result(tenant_dict(tenant), as_json, lambda: f"updated tenant {tenant.name}")


def _exclusive(*options: tuple[str, bool]) -> None:
    given = [name for name, present in options if present]
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join(given)} cannot be combined")


def _status_command(command_name: str, status: str, verb: str) -> click.Command:
    @click.command(command_name)
    @click.argument("name")
    @json_option
    @storage_options
    def command(name: str, as_json: bool) -> None:
        with open_session() as (settings, session):
            tenant = store.set_tenant_status(session, name=name, status=status)
            audit_change(
                session,
                settings,
                "tenant.update",
                f"tenants/{name}",
                tenant_id=tenant.id,
                status=status,
            )
            echo_result(tenant_dict(tenant), as_json, lambda: f"{verb} tenant {tenant.name}")

    command.help = f"{verb.capitalize()} a tenant (takes effect within the refresh interval)."
    return command


@click.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@storage_options
def delete(name: str, yes: bool, as_json: bool) -> None:
    """Delete a tenant: its keys are revoked and it can no longer authenticate; its
    usage, billing and audit records are kept (and its name stays taken)."""
    if not yes:
        if not sys.stdin.isatty():  # a script: no question it could answer
            raise InvalidArgument(f"give --yes to delete tenant {name} without a terminal")
        if not click.confirm(f"Delete tenant {name} and revoke all its keys?", default=False):
            raise click.Abort()
    with open_session() as (settings, session):
        deleted = store.delete_tenant(session, name=name)
        tenant = deleted.tenant
        audit_change(
            session,
            settings,
            "tenant.delete",
            f"tenants/{name}",
            tenant_id=tenant.id,
            revoked_keys=list(deleted.revoked_key_ids),
        )
        data = {**tenant_dict(tenant), "revoked_key_ids": list(deleted.revoked_key_ids)}
    count = len(deleted.revoked_key_ids)
    echo_result(
        data,
        as_json,
        lambda: (
            f"deleted tenant {name}: {count} key{'s' if count != 1 else ''} revoked; "
            "usage and audit records kept"
        ),
    )


tenants.add_command(_status_command("suspend", "suspended", "suspended"))
tenants.add_command(_status_command("resume", "active", "resumed"))
tenants.add_command(delete)

commands: list[click.Command] = [tenants]
