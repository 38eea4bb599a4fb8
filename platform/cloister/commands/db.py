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


commands: list[click.Command] = [db]
