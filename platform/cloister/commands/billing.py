"""`cloister billing export`: billing lines of a period as CSV or JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cloister.cli_context import json_option, storage_options


@click.group("billing")
def billing() -> None:
    """Billing exports."""


def _period(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Rejects a malformed or out-of-range period before the database is opened (exit 2)."""
    from admin.billing import parse_period
    from tenancy.errors import InvalidValueError

    try:
        parse_period(value)
    except InvalidValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


@billing.command("export")
@click.option("--period", required=True, callback=_period, help="YYYY-MM or YYYY-MM-DD (UTC).")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv")
@click.option("--tenant", default=None, help="Only this tenant (name).")
@click.option(
    "--output", type=click.Path(path_type=Path), default=None, help="File (default stdout)."
)
@json_option
@storage_options
def export(period: str, fmt: str, tenant: str | None, output: Path | None, as_json: bool) -> None:
    """A period header, lines per tenant x model x adapter x status x batch x unit prices
    (billable, unpriced and not-billed sections; batch lines at the price's batch discount),
    per-tenant and grand totals; see admin/billing_export.py.

    With --json: one document, {"period", "tenant", "records": [the JSON lines' objects]}.
    """
    from admin.billing_export import build_statement, render_statement
    from cloister.commands.admin import admin_context
    from tenancy import store

    with admin_context() as (_settings, sessions, _admin), sessions() as session:
        tenant_id = store.get_tenant(session, tenant).id if tenant else None
        statement = build_statement(session, period=period, tenant_id=tenant_id)
    if as_json:
        jsonl = render_statement(statement, "jsonl").splitlines()
        document = {"period": period, "tenant": tenant, "records": [json.loads(x) for x in jsonl]}
        text = json.dumps(document, sort_keys=True) + "\n"
    else:
        text = render_statement(statement, fmt)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)


commands: list[click.Command] = [billing]
