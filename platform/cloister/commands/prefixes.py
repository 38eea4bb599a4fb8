"""`cloister prefixes ...`: publish, list and withdraw shared prefixes.

A published prefix is shared by every tenant of its model; a running server pushes the
change to its engine within its refresh interval.
"""

from __future__ import annotations

from typing import Any

import click

from cloister.cli_context import echo_result, echo_table, json_option, storage_options
from cloister.cli_db import open_session
from cloister.commands.cli_audit import audit_change
from server.field_copy import attrs_dict


def parse_token_ids(value: str) -> list[int]:
    """ "1,2,3" -> [1, 2, 3]; anything else is a bad parameter."""
    try:
        ids = [int(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter(
            "give comma-separated non-negative integers", param_hint="--token-ids"
        ) from None
    return ids


def prefix_dict(row: Any) -> dict[str, Any]:
    """A published prefix as JSON-ready values."""
    return attrs_dict(
        row, ("id", "name", "model", "token_ids", "text"), created_at=row.created_at.isoformat()
    )


@click.group("prefixes")
def prefixes() -> None:
    """Manage published (shared) prefixes."""


@prefixes.command("publish")
@click.argument("name")
@click.option("--model", required=True, help="The registered model the prefix is for.")
@click.option("--text", help="The prefix as text (tokenized without special tokens).")
@click.option("--text-file", type=click.File("r", encoding="utf-8"), help="The text, from a file.")
@click.option("--token-ids", help="The prefix as comma-separated token ids.")
@json_option
@storage_options
def publish(
    name: str,
    model: str,
    text: str | None,
    text_file: Any,
    token_ids: str | None,
    as_json: bool,
) -> None:
    """Publish a prefix for every tenant of MODEL."""
    from admin import registry

    given = [
        o
        for o, v in (("--text", text), ("--text-file", text_file), ("--token-ids", token_ids))
        if v is not None
    ]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --text, --text-file and --token-ids")
    if text_file is not None:
        text = text_file.read()
    ids = parse_token_ids(token_ids) if token_ids is not None else None
    with open_session() as (settings, session):
        row = registry.publish_prefix(session, name=name, model=model, token_ids=ids, text=text)
        audit_change(session, settings, "prefix.publish", f"prefixes/{name}", model=model)
        data = prefix_dict(row)
    echo_result(data, as_json, lambda: f"published prefix {name}")


@prefixes.command("list")
@click.option("--model", help="Only this model's prefixes.")
@json_option
@storage_options
def list_(model: str | None, as_json: bool) -> None:
    """List published prefixes."""
    from admin import registry

    with open_session() as (_settings, session):
        rows = [prefix_dict(p) for p in registry.list_prefixes(session, model=model)]
    echo_table(
        rows,
        as_json,
        f"{'NAME':<32} {'MODEL':<24} KIND",
        lambda r: (
            f"{r['name']:<32} {r['model']:<24} "
            + (f"{len(r['token_ids'])} token ids" if r["token_ids"] is not None else "text")
        ),
    )


@prefixes.command("withdraw")
@click.argument("name")
@json_option
@storage_options
def withdraw(name: str, as_json: bool) -> None:
    """Withdraw a published prefix."""
    from admin import registry

    with open_session() as (settings, session):
        row = registry.withdraw_prefix(session, name=name)
        audit_change(session, settings, "prefix.withdraw", f"prefixes/{name}", model=row.model)
        data = prefix_dict(row)
    echo_result(data, as_json, lambda: f"withdrew prefix {name}")


commands: list[click.Command] = [prefixes]
