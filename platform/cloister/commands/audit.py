"""`cloister audit verify|export`: check the hash chain and checkpoints; export with proofs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cloister.cli_context import json_option, storage_options

if TYPE_CHECKING:
    from admin.audit_chain import VerifyReport


@click.group("audit")
def audit() -> None:
    """The tamper-evident audit log."""


def _public_key(given: str | None, admin_settings: object) -> str:
    from admin.audit_chain import load_private_key, public_hex

    if given:
        return given
    key = getattr(admin_settings, "audit_signing_key", None)
    if key is None:
        raise click.ClickException("give --public-key or set CLOISTER_ADMIN_AUDIT_SIGNING_KEY")
    return public_hex(load_private_key(key.get_secret_value()))


def _age(iso: str | None, now: dt.datetime) -> str:
    """How long ago `iso` was, for people: "42 s", "3 min", "5.0 h", "2.1 days"."""
    try:
        seconds = (now - dt.datetime.fromisoformat(iso or "")).total_seconds()
    except (TypeError, ValueError):
        return "an unknown time"
    if seconds < 120:
        return f"{max(0, round(seconds))} s"
    if seconds < 7200:
        return f"{round(seconds / 60)} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def checkpoint_summary(report: VerifyReport, now: dt.datetime | None = None) -> str:
    """The newest signed checkpoint's record and age, and how much after it is unsigned."""
    if report.newest_checkpoint_seq is None:
        return f"no signed checkpoint yet: all {report.records} records are unsigned"
    age = _age(report.newest_checkpoint_at, now or dt.datetime.now(dt.UTC))
    unsigned = report.unsigned
    after = (
        "nothing after it is unsigned"
        if unsigned == 0
        else f"{unsigned} record{'s' if unsigned != 1 else ''} after it not yet signed"
    )
    return (
        f"newest signed checkpoint at record {report.newest_checkpoint_seq}, "
        f"signed {age} ago ({report.newest_checkpoint_at}); {after}"
    )


@audit.command("verify")
@click.option(
    "--file",
    "--export",
    "export_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Verify an export file offline (no database, no settings) instead of the database.",
)
@click.option("--public-key", default=None, help="Trusted Ed25519 public key (hex).")
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=None,
    help="With --file: the exporter's checkpoint interval (each multiple must have one).",
)
@json_option
@storage_options
def verify(
    export_file: Path | None, public_key: str | None, checkpoint_every: int | None, as_json: bool
) -> None:
    """Verify the chain and signed checkpoints; names the first bad record (exit 1).

    Also says how old the newest signed checkpoint is: records after it are not
    protected yet (a running server signs one every CLOISTER_ADMIN_AUDIT_CHECKPOINT_INTERVAL_S).
    With --file, an export is checked offline and the message names the file's line
    at fault; without --public-key the manifest's own key is used (and said so).
    """
    if export_file is not None:
        _verify_file(export_file, public_key, checkpoint_every, as_json)
        return
    from admin.app import make_services
    from cloister.commands.admin import admin_context

    with admin_context() as (settings, sessions, admin_settings):
        trusted = _public_key(public_key, admin_settings)
        services = make_services(
            sessions, pepper=settings.key_pepper.get_secret_value(), settings=admin_settings
        )
        report = services.audit.verify(public_key=trusted)
    if as_json:
        click.echo(
            json.dumps({**dataclasses.asdict(report), "unsigned": report.unsigned}, sort_keys=True)
        )
        if not report.ok:
            raise SystemExit(1)
        return
    if report.ok:
        click.echo(
            f"ok: {report.records} records, {report.checkpoints} checkpoints; "
            + checkpoint_summary(report)
        )
        return
    click.echo(f"FAILED at record {report.first_bad_seq}: {report.reason}", err=True)
    raise SystemExit(1)


def _verify_file(
    path: Path, public_key: str | None, interval: int | None, as_json: bool = False
) -> None:
    """`verify --file`: one line, ok (exit 0) or the line at fault (exit 1); with
    `as_json`, {"ok", "message", "line"} on stdout either way."""
    from admin.audit_file import verify_export

    verdict = verify_export(
        path.read_text(encoding="utf-8", errors="replace"),
        public_key=public_key,
        interval=interval,
    )
    if as_json:
        click.echo(json.dumps({"ok": verdict.ok, "message": verdict.message, "line": verdict.line}))
    elif verdict.ok:
        click.echo(verdict.message)
    else:
        click.echo(verdict.message, err=True)
    if not verdict.ok:
        raise SystemExit(1)


@audit.command("export")
@click.option("--output", type=click.Path(path_type=Path), default=None)
@json_option
@storage_options
def export(output: Path | None, as_json: bool) -> None:
    """Export the log as JSON lines with a signed manifest and the checkpoints.

    With --json: one document, the list of those lines' objects (manifest first).
    """
    from admin.app import make_services
    from cloister.commands.admin import admin_context

    with admin_context() as (settings, sessions, admin_settings):
        services = make_services(
            sessions, pepper=settings.key_pepper.get_secret_value(), settings=admin_settings
        )
        try:
            text = services.audit.export_jsonl()
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        text = json.dumps([json.loads(line) for line in text.splitlines() if line]) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)


commands: list[click.Command] = [audit]
