"""`cloister models ...`: list registered models, set a model's output cap or its
fallback under overload, and list the model families the engine runs.

A running server applies a changed cap within its refresh interval, beside each key's
own `max_output_tokens` (the smaller one wins); a changed fallback likewise.
"""

from __future__ import annotations

from typing import Any

import click

from cloister.cli_context import (
    Cleared,
    InvalidArgument,
    NoneOr,
    echo_result,
    echo_table,
    json_option,
    storage_options,
)
from cloister.cli_db import open_session
from cloister.commands.cli_audit import audit_change
from server.field_copy import attrs_dict

_MODEL_FIELDS = (
    "id",
    "name",
    "format",
    "context_length",
    "status",
    "max_output_tokens",
    "allowed_tenants",
    "fallback_model",
)


def model_dict(row: Any) -> dict[str, Any]:
    """A registered model as JSON-ready values (its prices are the admin API's)."""
    return attrs_dict(row, _MODEL_FIELDS)


@click.group("models")
def models() -> None:
    """Registered models, their output caps and fallbacks."""


@models.command("list")
@json_option
@storage_options
def list_(as_json: bool) -> None:
    """List registered models."""
    from admin import registry

    with open_session() as (_settings, session):
        rows = [model_dict(m) for m in registry.list_models(session)]
    echo_table(
        rows,
        as_json,
        f"{'NAME':<32} {'STATUS':<11} {'CONTEXT':>8} {'MAX OUTPUT':<10} FALLBACK",
        lambda r: (
            f"{r['name']:<32} {r['status']:<11} {r['context_length']:>8} "
            + f"{'context' if r['max_output_tokens'] is None else r['max_output_tokens']:<10} "
            + (r["fallback_model"] or "-")
        ),
    )


@models.command("set")
@click.argument("name")
@click.option(
    "--max-output-tokens",
    type=NoneOr(click.INT),
    help="Most output tokens one request may ask of the model (none: its context length).",
)
@click.option(
    "--fallback-model",
    type=NoneOr(click.STRING),
    help="A registered model that answers, once, an interactive request this model's engine "
    "refuses as overloaded (none: no fallback).",
)
@json_option
@storage_options
def set_(
    name: str,
    max_output_tokens: int | Cleared | None,
    fallback_model: str | Cleared | None,
    as_json: bool,
) -> None:
    """Set a registered model's output cap (1 to 10**7, at most its context length) or its
    fallback under overload (another registered model, never a cycle)."""
    from admin import registry

    given = {"max_output_tokens": max_output_tokens, "fallback_model": fallback_model}
    changed: dict[str, Any] = {
        k: None if isinstance(v, Cleared) else v for k, v in given.items() if v is not None
    }
    if not changed:
        raise InvalidArgument("nothing to change: give --max-output-tokens or --fallback-model")
    with open_session() as (settings, session):
        row = registry.update_model(session, name=name, **changed)
        audit_change(session, settings, "model.update", f"models/{name}", **changed)
        data = model_dict(row)

    def text() -> str:
        parts = []
        if "max_output_tokens" in changed:
            cap = changed["max_output_tokens"]
            parts.append("max output tokens " + ("the context length" if cap is None else str(cap)))
        if "fallback_model" in changed:
            parts.append(f"fallback {changed['fallback_model'] or 'none'}")
        return f"model {name}: " + ", ".join(parts)

    echo_result(data, as_json, text)


commands: list[click.Command] = [models]


@models.command("families")
@json_option
def families(as_json: bool) -> None:
    """List the model families `cloister serve --model NAME=PATH` runs, by the names a
    Hugging Face folder (config.json `architectures`) or a GGUF file declares."""
    from engine.model.gguf_loader import SUPPORTED_TENSOR_TYPES
    from engine.model.registry import FAMILIES

    gguf_types = sorted(t.name for t in SUPPORTED_TENSOR_TYPES)
    rows = [{**f.describe(), "gguf_tensor_types": gguf_types} for f in FAMILIES]

    def text() -> str:
        lines = [f"{'FAMILY':<9} {'HUGGING FACE':<20} {'GGUF':<7} NOTES"]
        lines += [
            f"{r['family']:<9} {', '.join(r['hf_architectures']):<20} "
            f"{', '.join(r['gguf_architectures']) or '-':<7} {r['notes']}"
            for r in rows
        ]
        lines.append(f"GGUF tensor types: {', '.join(gguf_types)}")
        return "\n".join(lines)

    echo_result(rows, as_json, text)
