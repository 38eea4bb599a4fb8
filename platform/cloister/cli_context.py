"""The options every data command shares (`--data-dir`, `--database-url`, `--json`) and the
one `Settings` an invocation builds from them.

A command decorated with `storage_options` records its flags in click's context; the
first call of `cli_settings()` builds the settings (flags over CLOISTER_* variables, as
`cloister serve` does) and every later call in the same invocation gets the same object.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from server.settings import Settings
from server.settings.flat_names import refused_values

_LOCATION_KEY = "cloister.location"
_SETTINGS_KEY = "cloister.settings"


class CliError(click.ClickException):
    """A refusal the user can act on: one line on stderr, exit code 1."""


class InvalidArgument(click.ClickException):
    """A value refused as malformed or out of range (exit code 2, like click's own)."""

    exit_code = 2


@dataclass(frozen=True)
class Location:
    """Where the flags of this invocation say the data lives (None: not given)."""

    data_dir: Path | None = None
    database_url: str | None = None

    def overrides(self) -> dict[str, Any]:
        """The settings fields these flags set."""
        given = {"data_dir": self.data_dir, "database_url": self.database_url}
        return {k: v for k, v in given.items() if v is not None}


class _Where(BaseSettings):
    """The two location settings alone, read the way `Settings` reads them.

    Building `Settings` in development makes secrets in the data directory; this is
    read first, so that a command run from the wrong folder makes nothing there.
    """

    model_config = SettingsConfigDict(env_prefix="CLOISTER_", extra="ignore")

    data_dir: Path = Settings.model_fields["data_dir"].default
    database_url: str | None = None


def storage_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds `--data-dir` and `--database-url` to `command`; `cli_settings()` reads them."""

    @functools.wraps(command)
    def wrapper(*args: Any, data_dir: Path | None, database_url: str | None, **kw: Any) -> Any:
        click.get_current_context().meta[_LOCATION_KEY] = Location(data_dir, database_url)
        return command(*args, **kw)

    wrapper = click.option(
        "--database-url",
        default=None,
        metavar="URL",
        help="Database (default: SQLite in the data folder); or CLOISTER_DATABASE_URL.",
    )(wrapper)
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="The server's data folder (default ./var); or CLOISTER_DATA_DIR.",
    )(wrapper)


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds `--json` (passed as `as_json`): one JSON document on stdout."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document on stdout."
    )(command)


def location() -> Location:
    """The location flags of the running command (none given outside a command)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_root().meta.get(_LOCATION_KEY) if ctx is not None else None
    return found if isinstance(found, Location) else Location()


def default_database_missing() -> Path | None:
    """The default SQLite file when neither flag nor variable names a location and the
    file does not exist (a command run from the wrong folder); else None."""
    where = _Where(**location().overrides())
    if where.model_fields_set & {"data_dir", "database_url"}:
        return None
    path = (where.data_dir / "cloister.db").resolve()
    return None if path.exists() else path


def cli_settings() -> Settings:
    """The settings of this invocation: flags over CLOISTER_* variables, built once.

    A value the settings refuse is a one-line error naming it.
    """
    ctx = click.get_current_context(silent=True)
    root_meta = ctx.find_root().meta if ctx is not None else {}
    cached = root_meta.get(_SETTINGS_KEY)
    if isinstance(cached, Settings):
        return cached
    try:
        settings = Settings(**location().overrides())
    except ValidationError as exc:
        raise CliError(f"invalid settings: {'; '.join(refused_values(exc))}") from None
    except OSError as exc:  # the data folder or a secret file in it cannot be made or read
        raise CliError(f"cannot use {exc.filename or 'the data folder'}: {exc.strerror}") from None
    except ValueError as exc:  # a secret file with loose permissions, or empty
        raise CliError(str(exc)) from None
    root_meta[_SETTINGS_KEY] = settings
    return settings


def echo_result(data: Any, as_json: bool, text: Callable[[], str]) -> None:
    """`data` as one JSON document when `as_json`, else `text()` for people."""
    click.echo(json.dumps(data, sort_keys=True) if as_json else text())


def echo_table(
    rows: list[dict[str, Any]],
    as_json: bool,
    header: str,
    line: Callable[[dict[str, Any]], str],
) -> None:
    """`rows` as one JSON list when `as_json`, else a table: `header`, then a line a row."""
    echo_result(rows, as_json, lambda: "\n".join([header, *(line(r) for r in rows)]))


class Cleared:
    """The value of a limit option given as `none`: clear the setting."""

    def __repr__(self) -> str:
        return "CLEAR"


CLEAR = Cleared()


class NoneOr(click.ParamType[Any]):
    """`inner`'s values, or `none` (CLEAR): so that every limit option can unset its limit."""

    def __init__(self, inner: click.ParamType[Any]) -> None:
        self.inner = inner
        self.name = f"{inner.name}|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """CLEAR for "none" (any case), else the inner type's conversion."""
        if isinstance(value, str) and value.strip().lower() == "none":
            return CLEAR
        if value is CLEAR:
            return value
        return self.inner.convert(value, param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        """E.g. `INTEGER|none`, `[day|month|none]`."""
        if isinstance(self.inner, click.Choice):
            return "[" + "|".join([*map(str, self.inner.choices), "none"]) + "]"
        return f"{self.inner.name.upper().removesuffix(' RANGE')}|none"
