"""Subcommands of the `cloister` CLI; each module exposes `commands: list[click.Command]`."""
