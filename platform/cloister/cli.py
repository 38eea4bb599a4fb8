"""The `cloister` command line: a click group that gathers the subcommand modules.

Every failure a user can cause ends as ONE line on stderr, `error: ...`, and a non-zero
exit (2 for a bad argument, 1 otherwise); `--traceback` shows the Python traceback
instead, for bug reports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import click

# Each module exposes `commands: list[click.Command]`. The modules keep their heavy imports
# inside the command functions, so `cloister --help` stays fast.
COMMAND_MODULES: tuple[str, ...] = (
    "cloister.commands.serve",
    "cloister.commands.generate",
    "cloister.commands.tenants",
    "cloister.commands.keys",
    "cloister.commands.prefixes",
    "cloister.commands.batches",
    "cloister.commands.models",
    "cloister.commands.admin",
    "cloister.commands.billing",
    "cloister.commands.audit",
    "cloister.commands.bench",
    "cloister.commands.bench_serve",
    "cloister.commands.planning",
    "cloister.commands.engine_serve",
    "cloister.commands.db",
)


def one_line(message: str) -> str:
    """`message` on one line: its lines joined with "; ", blank ones dropped."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


def fail(message: str, code: int) -> None:
    """Prints `error: <message>` as one line on stderr and exits with `code`."""
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(code)


class CloisterGroup(click.Group):
    """A group whose errors are one line each (click prints usage and a hint otherwise)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Runs the command line; see the module docstring for what an error prints."""
        argv = list(sys.argv[1:] if args is None else args)
        prog_name = prog_name or "cloister"
        if "--traceback" in argv[:1]:  # only as the first argument: the group's own flag
            return super().main(argv[1:], prog_name, complete_var, standalone_mode, **extra)
        try:
            result = super().main(argv, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            fail(exc.format_message() + hint, exc.exit_code)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("aborted", 1)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except (BrokenPipeError, EOFError):  # e.g. `cloister tenants list | head -1`
            sys.exit(1)
        except Exception as exc:  # a bug: still one line, with how to see more
            fail(f"{type(exc).__name__}: {exc} (run `cloister --traceback ...` for details)", 1)
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=CloisterGroup)
@click.version_option(package_name="cloister", prog_name="cloister")
@click.option(
    "--traceback",
    is_flag=True,
    hidden=True,
    help="Show Python tracebacks instead of one-line errors (first argument only).",
)
def main(traceback: bool) -> None:
    """Cloister: multi-tenant LLM inference with isolated caches."""


for _module in COMMAND_MODULES:
    for _command in importlib.import_module(_module).commands:
        main.add_command(_command)
