"""`cloister db ...`: bring the schema to the newest revision, or wait until it is there.

A deployment runs `cloister db upgrade` once (a Kubernetes Job) before new gateways
start; the gateways' init container runs `cloister db wait`, so no replica serves on a
schema older than its code.
"""

from __future__ import annotations

import json
import time

import click

from cloister.cli_context import cli_settings, json_option, storage_options
from cloister.cli_db import redact_url

DEFAULT_WAIT_TIMEOUT_S = 300.0
WAIT_POLL_S = 2.0


def head_revision(url: str) -> str | None:
    """The newest revision the migrations folder knows."""
    from alembic.script import ScriptDirectory

    from tenancy.db import alembic_config

    head: str | None = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    return head


def current_revision(url: str) -> str | None:
    """The revision the database at `url` is at (None: no schema yet)."""
    from alembic.runtime.migration import MigrationContext

    from tenancy.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            revision: str | None = MigrationContext.configure(conn).get_current_revision()
            return revision
    finally:
        engine.dispose()


def one_line(exc: BaseException, url: str) -> str:
    """The first line of an exception's message, with its type (drivers' are multi-line),
    and never the password of `url`, should a driver quote it."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    password = url_password(url)
    return text.replace(password, "***") if password else text


def url_password(url: str) -> str | None:
    """The password in `url`, if it parses and has one."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        password = make_url(url).password
    except ArgumentError:
        return None
    return str(password) if password else None


def emit(as_json: bool, url: str, revision: str | None, verb: str) -> None:
    """Prints the outcome: one JSON object, or one sentence."""
    shown = redact_url(url)
    if as_json:
        click.echo(json.dumps({"database": shown, "revision": revision}))
    else:
        click.echo(f"{shown}: {verb} {revision}")


@click.group("db")
def db() -> None:
    """The database schema: migrate it, or wait for a migration to finish."""


@db.command("upgrade")
@json_option
@storage_options
def upgrade(as_json: bool) -> None:
    """Migrate the database to the newest revision (idempotent); --json: {database, revision}."""
    from tenancy.db import upgrade_database

    url = cli_settings().resolved_database_url
    try:
        upgrade_database(url)
        revision = current_revision(url)
    except Exception as exc:  # any driver or migration failure: one line, exit 1
        message = f"upgrade of {redact_url(url)} failed: {one_line(exc, url)}"
        raise click.ClickException(message) from None
    emit(as_json, url, revision, "at revision")


@db.command("wait")
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0.0),
    default=DEFAULT_WAIT_TIMEOUT_S,
    show_default=True,
    help="Give up (exit 1) after this long.",
)
@json_option
@storage_options
def wait(timeout_s: float, as_json: bool) -> None:
    """Wait until the database is reachable and at the newest revision; never migrates."""
    url = cli_settings().resolved_database_url
    head = head_revision(url)
    deadline = time.monotonic() + timeout_s
    last = "not checked"
    while True:
        try:
            revision = current_revision(url)
            if revision == head:
                emit(as_json, url, revision, "at revision")
                return
            last = f"at revision {revision}, waiting for {head}"
        except Exception as exc:  # unreachable yet: keep polling until the deadline
            last = one_line(exc, url)
        if time.monotonic() >= deadline:
            raise click.ClickException(
                f"{redact_url(url)} not at {head} after {timeout_s:g} s: {last}"
            )
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


@db.command("secrets")
@click.option(
    "--repin",
    is_flag=True,
    help="Pin this invocation's secrets in place of the database's (after a rotation).",
)
@click.option("--yes", is_flag=True, help="Confirm --repin.")
@json_option
@storage_options
def secrets_command(repin: bool, yes: bool, as_json: bool) -> None:
    """Compare this invocation's key pepper, console session key and audit signing key
    with the fingerprints the database was set up with; exit 1 where one differs.

    Every gateway and CLI on one database must hold the same three. --repin --yes
    pins these instead (audited): the processes still holding the old ones are then
    refused at their next start.
    """
    from assembly.deployment_secrets import deployment_secrets
    from cloister.cli_context import CliError, InvalidArgument
    from cloister.cli_db import (
        DB_ERRORS,
        database_error,
        migrated_engine,
        refuse_missing_default_database,
    )
    from cloister.commands.cli_audit import audit_change
    from tenancy.db import make_session_factory
    from tenancy.secret_pins import pin_states, repin_secrets

    if repin and not yes:
        raise InvalidArgument(
            "--repin locks out every process holding the pinned secrets; add --yes"
        )
    refuse_missing_default_database()  # before the settings make secrets in that folder
    settings = cli_settings()
    url = settings.resolved_database_url
    engine = migrated_engine(settings)
    try:
        with make_session_factory(engine)() as session:
            held = deployment_secrets(settings)
            states = repin_secrets(session, held) if repin else pin_states(session, held)
            changed = [s.secret.name for s in states if repin and s.state != "matches"]
            if changed:
                session.commit()
                audit_change(session, settings, "secrets.repin", "secret_pins", names=changed)
    except DB_ERRORS as exc:
        raise database_error(exc, url) from None
    finally:
        engine.dispose()
    rows = [
        {
            "name": s.secret.name,
            "setting": s.secret.setting,
            "state": s.state,
            "pinned_fingerprint": s.pinned,
            "pinned_at": None if s.pinned_at is None else s.pinned_at.isoformat(),
            "fingerprint": s.secret.fingerprint,
        }
        for s in states
    ]
    if as_json:
        click.echo(json.dumps({"database": redact_url(url), "secrets": rows, "repinned": changed}))
    else:
        for row in rows:
            pinned = f", pinned {row['pinned_at']}" if row["pinned_at"] else ""
            click.echo(f"{row['name']} ({row['setting']}): {row['state']}{pinned}")
        if changed:
            click.echo(f"pinned this invocation's {', '.join(changed)}")
    differing = [s.secret.setting for s in states if s.state == "differs"]
    if differing and not repin:
        raise CliError(f"{', '.join(differing)} differ from this database's pins")


commands: list[click.Command] = [db]
