"""The `cloister` command line."""

import click


@click.group()
def main() -> None:
    """Cloister: multi-tenant LLM inference with isolated caches."""
