"""The log formats (issue 19, section 5): a terminal gets readable lines, a pipe gets one
JSON object per line without ANSI codes, neither shows a secret, alembic stays quiet."""

from __future__ import annotations

import io
import json
import logging
import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from admin.identity import TOKEN_PREFIX
from server.logging_setup import ADMIN_TOKEN_PREFIX, configure_logging
from server.settings import Settings
from tenancy.db import upgrade_database

TENANT_KEY = "sk-clo-acme_" + "Zx9" * 12
ADMIN_TOKEN = TOKEN_PREFIX + "q7Wm" * 10
PEPPER = "pepper-that-must-stay-secret-0123456789"
CONSOLE_LINE = re.compile(r"^\d\d:\d\d:\d\d (\x1b\[[0-9;]*m)?[A-Z]+ *(\x1b\[0m)? [\w.]+: ")


class TerminalStream(io.StringIO):
    """A stream that says it is a terminal, as stderr does in a shell."""

    def isatty(self) -> bool:
        """Always a terminal."""
        return True


def _log_everything(tmp_path: Path) -> None:
    """What a server logs, secrets offered everywhere a careless call could put them."""
    log = logging.getLogger("cloister.test")
    log.info("request done", extra={"request_id": "chatcmpl-1", "tenant": "acme", "status": 200})
    log.info("calling with key %s", TENANT_KEY)
    log.info("admin signed in", extra={"headers": {"authorization": f"Bearer {ADMIN_TOKEN}"}})
    log.info("token was %s", ADMIN_TOKEN)
    settings = Settings(data_dir=tmp_path, key_pepper=PEPPER)
    log.info("settings: %r", settings)
    log.warning("multi\nline")
    try:
        raise RuntimeError(f"failed for {TENANT_KEY} and {ADMIN_TOKEN}")
    except RuntimeError:
        log.exception("boom")
    # uvicorn's own start-up line carries a coloured copy of its message.
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]",
        42,
        extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"},
    )


def _assert_no_secret(text: str) -> None:
    for secret in (TENANT_KEY, ADMIN_TOKEN, PEPPER, ADMIN_TOKEN.removeprefix(TOKEN_PREFIX)):
        assert secret not in text


def test_the_redactor_knows_the_admin_token_prefix() -> None:
    assert ADMIN_TOKEN_PREFIX == TOKEN_PREFIX


def test_a_terminal_gets_readable_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = TerminalStream()
    configure_logging("INFO", stream=tty)  # "auto"
    _log_everything(tmp_path)
    text = tty.getvalue()
    _assert_no_secret(text)
    first = text.splitlines()[0]
    assert CONSOLE_LINE.match(first), first
    assert first.endswith(
        "cloister.test: request done request_id=chatcmpl-1 tenant=acme status=200"
    )
    assert "\x1b[33mWARNING" in text  # the level is coloured on a terminal
    assert "Started server process [42]" in text and "\x1b[36m" not in text
    assert "Traceback" in text and "RuntimeError" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(first)


def test_no_colour_with_no_color(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    tty = TerminalStream()
    configure_logging("INFO", stream=tty)
    logging.getLogger("cloister.test").warning("careful")
    assert "\x1b" not in tty.getvalue() and "WARNING" in tty.getvalue()


def test_a_pipe_gets_json_lines_without_ansi(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, encoding="utf-8") as reader:
        with os.fdopen(write_fd, "w", encoding="utf-8") as pipe:
            configure_logging("INFO", stream=pipe)
            _log_everything(tmp_path)
            logging.getLogger().removeHandler(logging.getLogger().handlers[-1])
        text = reader.read()
    _assert_no_secret(text)
    assert "\x1b" not in text and "\\u001b" not in text and "color_message" not in text
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one object
    assert len(lines) == 8
    assert lines[0]["message"] == "request done" and lines[0]["tenant"] == "acme"
    assert lines[0]["request_id"] == "chatcmpl-1" and lines[0]["status"] == 200
    assert {"ts", "level", "logger", "message"} <= set(lines[0])
    assert lines[5]["message"] == "multi\nline"
    assert "RuntimeError" in lines[6]["exc"]
    assert lines[7]["message"] == "Started server process [42]"


def test_the_setting_overrides_what_the_stream_is() -> None:
    tty, pipe = TerminalStream(), io.StringIO()
    configure_logging("INFO", stream=tty, fmt="json")
    logging.getLogger("cloister.test").info("one")
    configure_logging("INFO", stream=pipe, fmt="console")
    logging.getLogger("cloister.test").info("two")
    assert json.loads(tty.getvalue())["message"] == "one"
    assert CONSOLE_LINE.match(pipe.getvalue()) and "\x1b" not in pipe.getvalue()


def test_log_format_is_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(data_dir=tmp_path, key_pepper=PEPPER).telemetry.log_format == "auto"
    monkeypatch.setenv("CLOISTER_LOG_FORMAT", "json")
    assert Settings(data_dir=tmp_path, key_pepper=PEPPER).telemetry.log_format == "json"
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, key_pepper=PEPPER, log_format="xml")


@pytest.mark.parametrize(("level", "quiet"), [("INFO", True), ("DEBUG", False)])
def test_alembic_is_quiet_unless_debug(tmp_path: Path, level: str, quiet: bool) -> None:
    stream = io.StringIO()
    configure_logging(level, stream=stream)
    upgrade_database(f"sqlite:///{tmp_path / 'fresh.db'}")
    loggers = [json.loads(line)["logger"] for line in stream.getvalue().splitlines()]
    from_alembic = [name for name in loggers if name.startswith("alembic")]
    assert (not from_alembic) if quiet else len(from_alembic) >= 5
