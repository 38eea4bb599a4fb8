"""`cloister audit verify|export`: check the hash chain and checkpoints; export with proofs."""

from __future__ import annotations

from pathlib import Path

import click


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


@audit.command("verify")
@click.option(
    "--export",
    "export_file",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Verify an export file instead of the database.",
)
@click.option("--public-key", default=None, help="Trusted Ed25519 public key (hex).")
def verify(export_file: Path | None, public_key: str | None) -> None:
    """Verify the chain and signed checkpoints; names the first bad record (exit 1)."""
    from admin.app import make_services
    from admin.audit_chain import parse_export
    from admin.audit_chain import verify as verify_chain
    from cloister.commands.admin import admin_context

    with admin_context() as (settings, sessions, admin_settings):
        trusted = _public_key(public_key, admin_settings)
        if export_file is not None:
            manifest, records, cps = parse_export(export_file.read_text())
            report = verify_chain(
                records,
                cps,
                public_key=trusted,
                interval=admin_settings.audit_checkpoint_every,
                manifest=manifest,
            )
        else:
            services = make_services(
                sessions, pepper=settings.key_pepper.get_secret_value(), settings=admin_settings
            )
            report = services.audit.verify(public_key=trusted)
    if report.ok:
        click.echo(f"ok: {report.records} records, {report.checkpoints} checkpoints")
        return
    click.echo(f"FAILED at record {report.first_bad_seq}: {report.reason}", err=True)
    raise SystemExit(1)


@audit.command("export")
@click.option("--output", type=click.Path(path_type=Path), default=None)
def export(output: Path | None) -> None:
    """Export the log as JSON lines with a signed manifest and the checkpoints."""
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
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)


commands: list[click.Command] = [audit]
