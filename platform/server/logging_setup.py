"""The one structured logging setup: JSON lines on stderr, with secrets redacted.

Every record passes `RedactingFilter` before it is formatted, so an API key or an
Authorization header never reaches a log sink, whichever module logged it. Records
logged while a request is served carry its `request_id` (server/request_ids.py).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from server.request_ids import RequestIdFilter

# Keys look like `sk-<tenant-ish prefix>_<random>`; match generously so that
# a key embedded in any text (a URL, a repr of headers) is caught.
_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_\-\.]{4,}")
_AUTH_PATTERN = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(bearer\s+)?[^\s'\",}]+")
_BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9_\-\.=]+")
REDACTED = "[REDACTED]"
_SECRET_FIELDS = frozenset({"authorization", "api_key", "key", "token", "password", "secret"})

# Attributes every LogRecord has; anything else was passed through `extra=`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def redact(text: str) -> str:
    """Returns `text` with API keys, bearer tokens and Authorization values masked."""
    text = _AUTH_PATTERN.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER_PATTERN.sub(lambda m: m.group(1) + REDACTED, text)
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Serialises the record; values that JSON cannot hold become strings."""
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRS:
                payload[name] = value
        if record.exc_text:
            payload["exc"] = record.exc_text
        elif record.exc_info:
            payload["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


def configure_logging(level: str = "INFO", *, stream: TextIO | None = None) -> logging.Handler:
    """Installs the JSON handler with redaction on the root logger, replacing earlier ones.

    Called once by the process entry point (`cloister serve`); returns the handler
    so that tests can remove it again.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())  # before redaction: a client's id is redacted too
    handler.addFilter(RedactingFilter())
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
    return handler
