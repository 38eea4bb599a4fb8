"""The one logging setup: readable lines on a terminal, JSON lines elsewhere, secrets
redacted in both.

Every record passes `RedactingFilter` before it is formatted, so an API key or an
Authorization header never reaches a log sink, whichever module logged it. Records
logged while a request is served carry its `request_id` (server/request_ids.py). The
format is the `log_format` setting: "console", "json", or "auto" (console exactly when
the stream is a terminal, so that log collectors always get JSON).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from server.request_ids import RequestIdFilter

LogFormat = Literal["auto", "console", "json"]

# Keys look like `sk-<tenant-ish prefix>_<random>`; match generously so that
# a key embedded in any text (a URL, a repr of headers) is caught.
_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_\-\.]{4,}")
# Admin tokens (admin.identity.TOKEN_PREFIX) are secrets too, wherever they appear.
ADMIN_TOKEN_PREFIX = "clo-adm-"
_ADMIN_TOKEN_PATTERN = re.compile(re.escape(ADMIN_TOKEN_PREFIX) + r"[A-Za-z0-9_\-]{4,}")
_AUTH_PATTERN = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(bearer\s+)?[^\s'\",}]+")
_BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9_\-\.=]+")
REDACTED = "[REDACTED]"
_SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "token", "password", "secret"})

# Attributes every LogRecord has; anything else was passed through `extra=`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)
# An extra field that says the message already spells out the other extra fields, so
# the console shows the message alone (JSON still carries every field).
MESSAGE_HAS_FIELDS = "message_has_fields"
# uvicorn passes a copy of some messages with ANSI colours as `color_message`: never ours.
_DROPPED_FIELDS = frozenset({"color_message", MESSAGE_HAS_FIELDS})
_ANSI_PATTERN = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Loggers that are chatty at INFO; below DEBUG they say only warnings. Alembic prints a
# line per migration step at every start; uvicorn's access line repeats cloister.access;
# httpx (and httpcore under it) logs every request a gateway makes, and a gateway over
# engine servers polls each one's stats every second.
QUIET_LOGGERS = ("alembic", "uvicorn.access", "httpx", "httpcore")


def redact(text: str) -> str:
    """Returns `text` with API keys, admin tokens, bearer tokens and Authorization values
    masked."""
    text = _AUTH_PATTERN.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER_PATTERN.sub(lambda m: m.group(1) + REDACTED, text)
    text = _ADMIN_TOKEN_PATTERN.sub(REDACTED, text)
    return _KEY_PATTERN.sub(REDACTED, text)


def _redact_value(name: str, value: Any) -> Any:
    if name.lower() in _SECRET_FIELDS:
        return REDACTED
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value("", v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's message, arguments and extra fields, in place."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrites the record so that no secret survives; never drops it."""
        record.msg = redact(record.getMessage())
        record.args = None
        for name, value in list(vars(record).items()):
            if name not in _STANDARD_ATTRS:
                setattr(record, name, _redact_value(name, value))
        if record.exc_info and record.exc_info[1] is not None:
            # Formatting happens later; freeze the redacted traceback text now.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record was given with `extra=`, less the ones no sink wants."""
    return {
        name: value
        for name, value in vars(record).items()
        if name not in _STANDARD_ATTRS and name not in _DROPPED_FIELDS
    }


def strip_ansi(text: str) -> str:
    """`text` without ANSI escape sequences (colours, cursor moves)."""
    return _ANSI_PATTERN.sub("", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Serialises the record; values that JSON cannot hold become strings."""
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": strip_ansi(record.getMessage()),
        }
        payload.update(_extra_fields(record))
        if record.exc_text:
            payload["exc"] = record.exc_text
        elif record.exc_info:
            payload["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


_LEVEL_COLOURS = {
    "DEBUG": "\x1b[2m",
    "WARNING": "\x1b[33m",
    "ERROR": "\x1b[31m",
    "CRITICAL": "\x1b[1;31m",
}
_RESET = "\x1b[0m"


class ConsoleFormatter(logging.Formatter):
    """`HH:MM:SS LEVEL logger: message key=value ...`, for a person at a terminal.

    Extra fields follow the message as key=value pairs, unless the record says its
    message already holds them (`MESSAGE_HAS_FIELDS`). With `colour`, the level is
    coloured; nothing else is.
    """

    def __init__(self, *, colour: bool = False) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        """The record as one readable line (a multi-line message stays multi-line)."""
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        level = f"{record.levelname:<7}"
        if self.colour and record.levelname in _LEVEL_COLOURS:
            level = f"{_LEVEL_COLOURS[record.levelname]}{level}{_RESET}"
        line = f"{when} {level} {record.name}: {record.getMessage()}"
        fields = ""
        if not getattr(record, MESSAGE_HAS_FIELDS, False):
            fields = " ".join(
                f"{name}={_console_value(value)}"
                for name, value in _extra_fields(record).items()
                if value is not None
            )
        if fields:
            line = f"{line} {fields}"
        exc = record.exc_text or (
            redact(self.formatException(record.exc_info)) if record.exc_info else None
        )
        return f"{line}\n{exc}" if exc else line


def _console_value(value: Any) -> str:
    if isinstance(value, str):
        return value if value and not any(c.isspace() for c in value) else json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def resolve_log_format(fmt: LogFormat, stream: TextIO) -> Literal["console", "json"]:
    """The format `fmt` means on `stream`: "auto" is console on a terminal, else JSON."""
    if fmt == "auto":
        return "console" if is_terminal(stream) else "json"
    return fmt


def make_handler(stream: TextIO, fmt: LogFormat = "auto") -> logging.Handler:
    """A handler writing to `stream` in the format `fmt` resolves to there, redacting.

    On a terminal the level is coloured, unless NO_COLOR is set.
    """
    handler = logging.StreamHandler(stream)
    if resolve_log_format(fmt, stream) == "console":
        colour = is_terminal(stream) and "NO_COLOR" not in os.environ
        handler.setFormatter(ConsoleFormatter(colour=colour))
    else:
        handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())  # before redaction: a client's id is redacted too
    handler.addFilter(RedactingFilter())
    return handler


def configure_logging(
    level: str = "INFO", *, stream: TextIO | None = None, fmt: LogFormat = "auto"
) -> logging.Handler:
    """Installs the redacting handler on the root logger, replacing earlier ones.

    `fmt` is the `log_format` setting, resolved against `stream` (default stderr).
    Called once by the process entry point (`cloister serve`); returns the handler
    so that tests can remove it again.
    """
    handler = make_handler(stream or sys.stderr, fmt)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_cloister", False)]:
        root.removeHandler(old)
    handler._cloister = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    # uvicorn installs its own handlers; route its records through ours instead.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    debug = root.level <= logging.DEBUG
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)
    return handler
