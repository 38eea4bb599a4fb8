"""The `cloister` command line: a click group that gathers the subcommand modules."""

from __future__ import annotations

import importlib

import click

# Each module exposes `commands: list[click.Command]`. The modules keep their heavy imports
# inside the command functions, so `cloister --help` stays fast.
COMMAND_MODULES: tuple[str, ...] = (
    "cloister.commands.serve",
    "cloister.commands.generate",
    "cloister.commands.tenants",
    "cloister.commands.keys",
    "cloister.commands.prefixes",
    "cloister.commands.admin",
    "cloister.commands.billing",
    "cloister.commands.audit",
    "cloister.commands.bench",
    "cloister.commands.bench_serve",
    "cloister.commands.planning",
    "cloister.commands.db",
)


@click.group()
def main() -> None:
    """Cloister: multi-tenant LLM inference with isolated caches."""


for _module in COMMAND_MODULES:
    for _command in importlib.import_module(_module).commands:
        main.add_command(_command)
