"""The CLI's database: found, created or migrated as `cloister serve` would, and every
database or tenancy failure turned into a one-line error instead of a traceback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import click
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from cloister.cli_context import CliError, InvalidArgument, cli_settings, default_database_missing
from server.settings import Settings, private_data_dir
from tenancy.errors import InvalidValueError, TenancyError

_PASSWORD_IN_URL = re.compile(r"(//[^:/@]*):[^@/]*@")


def redact_url(url: str) -> str:
    """`url` with any password replaced by ***, whether SQLAlchemy can parse it or not."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is shown as given, less what looks like a password
        return _PASSWORD_IN_URL.sub(r"\1:***@", url)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__


def database_error(exc: Exception, url: str) -> click.ClickException:
    """The one-line error for a failure to open, migrate or use the database at `url`."""
    from alembic.util import CommandError

    where = redact_url(url)
    if isinstance(exc, sa.exc.ArgumentError | sa.exc.NoSuchModuleError):
        return InvalidArgument(
            f"not a database URL: {where!r} (e.g. postgresql://user@host/db or sqlite:///path)"
        )
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return CliError(f"cannot reach the database at {where}: {_first_line(exc)}")
    if isinstance(exc, CommandError):
        return CliError(f"cannot migrate the database at {where}: {_first_line(exc)}")
    if isinstance(exc, OSError):
        return CliError(f"{exc.strerror or exc}: {exc.filename or where}")
    return CliError(f"database error at {where}: {_first_line(exc)}")


DB_ERRORS = (sa.exc.SQLAlchemyError, OSError)  # a failure to reach or use the database


def refuse_missing_default_database() -> None:
    """A one-line error when no location is given and the default folder has no database.

    The command was most likely run from the wrong folder; a fresh empty database (and
    fresh secrets) there would hide the server's real one.
    """
    missing = default_database_missing()
    if missing is not None:
        raise CliError(
            f"no database at {missing}: run this where `cloister serve` runs, or give "
            "--data-dir DIR (or CLOISTER_DATA_DIR) to use, or create, the data folder there"
        )


def migrated_engine(settings: Settings) -> sa.Engine:
    """An engine on the configured database, migrated to the newest schema first.

    Without any location given and no database in the default folder, nothing is made
    (see `refuse_missing_default_database`).
    """
    from alembic.util import CommandError

    from tenancy.db import make_engine, upgrade_database

    refuse_missing_default_database()
    url = settings.resolved_database_url
    try:
        if settings.database_url is None:
            private_data_dir(settings.data_dir)
        upgrade_database(url)
        return make_engine(url)
    except (*DB_ERRORS, CommandError) as exc:
        raise database_error(exc, url) from None


def prepared_engine(settings: Settings) -> sa.Engine:
    """`migrated_engine`, once this process's secrets match the database's pins
    (assembly.deployment_secrets)."""
    from assembly.deployment_secrets import check_deployment_secrets
    from tenancy.db import make_session_factory
    from tenancy.secret_pins import SecretMismatchError

    engine = migrated_engine(settings)
    try:
        # A command holding other secrets than the servers' would make keys they refuse
        # and sign audit checkpoints that fail verification.
        check_deployment_secrets(settings, make_session_factory(engine))
    except SecretMismatchError as exc:
        engine.dispose()
        raise CliError(str(exc)) from None
    except DB_ERRORS as exc:
        engine.dispose()
        raise database_error(exc, settings.resolved_database_url) from None
    return engine


@contextmanager
def session_factory() -> Iterator[tuple[Settings, sessionmaker[Session]]]:
    """(settings, session factory) on the migrated database; errors become CLI errors.

    A value out of range exits 2, like any other bad argument; other refusals exit 1.
    """
    from tenancy.db import make_session_factory

    refuse_missing_default_database()  # before the settings make secrets in that folder
    settings = cli_settings()
    engine = prepared_engine(settings)
    try:
        yield settings, make_session_factory(engine)
    except InvalidValueError as exc:
        raise InvalidArgument(str(exc)) from None
    except TenancyError as exc:
        raise CliError(str(exc)) from None
    except DB_ERRORS as exc:
        raise database_error(exc, settings.resolved_database_url) from None
    finally:
        engine.dispose()


@contextmanager
def open_session() -> Iterator[tuple[Settings, Session]]:
    """(settings, one session) on the migrated database; see `session_factory`."""
    with session_factory() as (settings, sessions), sessions() as session:
        yield settings, session
