"""The `cloister` command line: a click group that gathers the subcommand modules."""

from __future__ import annotations

import importlib

import click

# Each module exposes `commands: list[click.Command]`; imported lazily so that
# `cloister generate` never pays for the web stack's imports.
COMMAND_MODULES: tuple[str, ...] = ()


@click.group()
def main() -> None:
    """Cloister: multi-tenant LLM inference with isolated caches."""


for _module in COMMAND_MODULES:
    for _command in importlib.import_module(_module).commands:
        main.add_command(_command)
