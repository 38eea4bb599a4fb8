"""Checks on a `cloister` command that refused its flags (click's CliRunner result)."""

from __future__ import annotations

from typing import Any


def assert_refused_by_name(result: Any, flags: list[str]) -> None:
    """The command exited 1 or 2 with no traceback and no "No such option", and its output
    names the first flag (with dashes or underscores)."""
    assert result.exit_code in (1, 2), result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    assert "Traceback" not in result.output and "No such option" not in result.output
    name = flags[0].removeprefix("--")
    assert name in result.output or name.replace("-", "_") in result.output, result.output
