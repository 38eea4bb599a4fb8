"""`cloister tenants ...`: create, list, limit, suspend and resume tenants."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from sqlalchemy.orm import Session

from cloister.commands.cli_audit import audit_change
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.errors import InvalidValueError, TenancyError
from tenancy.limits import EffectiveLimits
from tenancy.models import Tenant


class InvalidArgument(click.ClickException):
    """A value the store refused as malformed or out of range (exit code 2, no traceback)."""

    exit_code = 2


@contextmanager
def open_session() -> Iterator[Session]:
    """A session on the configured database, migrated first; tenancy errors become CLI errors.

    A value out of range exits 2, like any other bad argument; other refusals exit 1.
    """
    url = Settings().resolved_database_url
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            yield session
    except InvalidValueError as exc:
        raise InvalidArgument(str(exc)) from exc
    except TenancyError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()


def parse_models(value: str | None) -> list[str] | None:
    """ "a,b" -> ["a", "b"]; None stays None."""
    if value is None:
        return None
    models = [m.strip() for m in value.split(",") if m.strip()]
    if not models:
        raise click.BadParameter("give at least one model name", param_hint="--models")
    return models


def tenant_dict(tenant: Tenant) -> dict[str, Any]:
    """A tenant as JSON-ready values."""
    return {
        "id": tenant.id,
        "name": tenant.name,
        "status": tenant.status,
        "isolation_level": tenant.isolation_level,
        "weight": tenant.weight,
        "cache_floor_blocks": tenant.cache_floor_blocks,
        "cache_floor_share": tenant.cache_floor_share,
        "retention_ttl_s": tenant.retention_ttl_s,
        "scrub_on_free": tenant.scrub_on_free,
        "never_cache": bool(tenant.never_cache),
        "created_at": tenant.created_at.isoformat(),
    }


def limits_dict(limits: EffectiveLimits) -> dict[str, Any]:
    """Limits as JSON-ready values (None: unlimited)."""
    out = dataclasses.asdict(limits)
    out["allowed_models"] = sorted(limits.allowed_models) if limits.allowed_models else None
    out["key_scoped"] = sorted(limits.key_scoped)
    return out


def _echo(data: Any, as_json: bool, text: Callable[[], str]) -> None:
    click.echo(json.dumps(data, sort_keys=True) if as_json else text())


@click.group("tenants")
def tenants() -> None:
    """Manage tenants and their limits."""


@tenants.command("create")
@click.argument("name")
@click.option("--isolation", type=click.Choice(["tenant", "key", "user"]), default="tenant")
@click.option("--weight", type=float, default=1.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def create(name: str, isolation: str, weight: float, as_json: bool) -> None:
    """Create a tenant."""
    with open_session() as session:
        tenant = store.create_tenant(session, name=name, isolation_level=isolation, weight=weight)
        audit_change(
            session,
            "tenant.create",
            f"tenants/{name}",
            tenant_id=tenant.id,
            isolation_level=isolation,
            weight=weight,
        )
        _echo(tenant_dict(tenant), as_json, lambda: f"created tenant {tenant.name} ({tenant.id})")


@tenants.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(as_json: bool) -> None:
    """List tenants."""
    with open_session() as session:
        rows = [tenant_dict(t) for t in store.list_tenants(session)]

    def text() -> str:
        lines = [f"{'ID':<18} {'NAME':<24} {'STATUS':<10} {'ISOLATION':<10} WEIGHT"]
        lines += [
            f"{r['id']:<18} {r['name']:<24} {r['status']:<10} {r['isolation_level']:<10} "
            f"{r['weight']:g}"
            for r in rows
        ]
        return "\n".join(lines)

    _echo(rows, as_json, text)


@tenants.command("set-limits")
@click.argument("name")
@click.option("--rpm", type=click.IntRange(min=0), help="Requests per minute.")
@click.option("--tpm", type=click.IntRange(min=0), help="Tokens per minute.")
@click.option("--concurrency", type=click.IntRange(min=0), help="Concurrent requests.")
@click.option("--budget", type=click.IntRange(min=0), help="Token budget per period.")
@click.option("--budget-period", type=click.Choice(["day", "month"]))
@click.option("--max-output-tokens", type=click.IntRange(min=1))
@click.option("--max-prompt-tokens", type=click.IntRange(min=1))
@click.option("--models", help="Comma-separated allowed models.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def set_limits(
    name: str,
    rpm: int | None,
    tpm: int | None,
    concurrency: int | None,
    budget: int | None,
    budget_period: str | None,
    max_output_tokens: int | None,
    max_prompt_tokens: int | None,
    models: str | None,
    as_json: bool,
) -> None:
    """Set a tenant's limits (only the options given change) and print those in force."""
    if budget_period is not None and budget is None:
        raise click.BadParameter("needs --budget", param_hint="--budget-period")
    given: dict[str, Any] = {
        "rpm": rpm,
        "tpm": tpm,
        "max_concurrent": concurrency,
        "token_budget": budget,
        "budget_period": budget_period,
        "max_output_tokens": max_output_tokens,
        "max_prompt_tokens": max_prompt_tokens,
        "allowed_models": parse_models(models),
    }
    changed = {k: v for k, v in given.items() if v is not None}
    with open_session() as session:
        limits = store.set_limits(session, tenant_name=name, **changed)
        tenant = store.get_tenant(session, name)
        audit_change(
            session, "limits.set", f"tenants/{name}/limits", tenant_id=tenant.id, **changed
        )
    data = limits_dict(limits)

    def text() -> str:
        return "\n".join(
            f"{k}: {'unlimited' if v is None else v}" for k, v in data.items() if k != "key_scoped"
        )

    _echo(data, as_json, text)


@tenants.command("update")
@click.argument("name")
@click.option("--weight", type=float, help="Scheduling weight (0.01 to 100).")
@click.option("--cache-floor-blocks", type=int, help="KV blocks kept for this tenant's cache.")
@click.option("--cache-floor-share", type=float, help="Share of the KV pool kept (0 to 1).")
@click.option("--no-cache-floor", is_flag=True, help="Remove the cache floor.")
@click.option("--retention-ttl-s", type=float, help="Seconds a freed cached block is kept.")
@click.option("--default-retention-ttl", is_flag=True, help="Back to the engine's TTL.")
@click.option(
    "--scrub-on-free/--no-scrub-on-free",
    default=None,
    help="Zero this tenant's KV blocks when they are freed.",
)
@click.option("--default-scrub", is_flag=True, help="Back to the engine's scrub setting.")
@click.option("--never-cache/--cache", default=None, help="Never read or write the prefix cache.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def update(
    name: str,
    weight: float | None,
    cache_floor_blocks: int | None,
    cache_floor_share: float | None,
    no_cache_floor: bool,
    retention_ttl_s: float | None,
    default_retention_ttl: bool,
    scrub_on_free: bool | None,
    default_scrub: bool,
    never_cache: bool | None,
    as_json: bool,
) -> None:
    """Change a tenant's weight and cache policy (only the options given change); the
    running server applies it within its refresh interval."""
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
    given: dict[str, Any] = {
        "weight": weight,
        "cache_floor_blocks": cache_floor_blocks,
        "cache_floor_share": cache_floor_share,
        "retention_ttl_s": retention_ttl_s,
        "scrub_on_free": scrub_on_free,
        "never_cache": never_cache,
    }
    changed = {k: v for k, v in given.items() if v is not None}
    if no_cache_floor:
        changed.update(cache_floor_blocks=None, cache_floor_share=None)
    if default_retention_ttl:
        changed["retention_ttl_s"] = None
    if default_scrub:
        changed["scrub_on_free"] = None
    if not changed:
        raise InvalidArgument("nothing to change: give at least one option")
    with open_session() as session:
        tenant = store.update_tenant(session, name=name, **changed)
        audit_change(session, "tenant.update", f"tenants/{name}", tenant_id=tenant.id, **changed)
        _echo(tenant_dict(tenant), as_json, lambda: f"updated tenant {tenant.name}")


def _exclusive(*options: tuple[str, bool]) -> None:
    given = [name for name, present in options if present]
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join(given)} cannot be combined")


def _status_command(command_name: str, status: str, verb: str) -> click.Command:
    @click.command(command_name)
    @click.argument("name")
    def command(name: str) -> None:
        with open_session() as session:
            tenant = store.set_tenant_status(session, name=name, status=status)
            audit_change(
                session, "tenant.update", f"tenants/{name}", tenant_id=tenant.id, status=status
            )
            click.echo(f"{verb} tenant {tenant.name}")

    command.help = f"{verb.capitalize()} a tenant (takes effect within the refresh interval)."
    return command


tenants.add_command(_status_command("suspend", "suspended", "suspended"))
tenants.add_command(_status_command("resume", "active", "resumed"))

commands: list[click.Command] = [tenants]
