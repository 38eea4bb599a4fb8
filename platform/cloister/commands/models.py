"""`cloister models ...`: list registered models, set a model's output cap, and list
the model families the engine runs.

A running server applies a changed cap within its refresh interval, beside each key's
own `max_output_tokens` (the smaller one wins).
"""

from __future__ import annotations

from typing import Any

import click

from cloister.cli_context import Cleared, NoneOr, echo_result, json_option, storage_options
from cloister.cli_db import open_session
from cloister.commands.cli_audit import audit_change


def model_dict(row: Any) -> dict[str, Any]:
    """A registered model as JSON-ready values (its prices are the admin API's)."""
    return {
        "id": row.id,
        "name": row.name,
        "format": row.format,
        "context_length": row.context_length,
        "status": row.status,
        "max_output_tokens": row.max_output_tokens,
        "allowed_tenants": row.allowed_tenants,
    }


@click.group("models")
def models() -> None:
    """Registered models and their output caps."""


@models.command("list")
@json_option
@storage_options
def list_(as_json: bool) -> None:
    """List registered models."""
    from admin import registry

    with open_session() as (_settings, session):
        rows = [model_dict(m) for m in registry.list_models(session)]

    def text() -> str:
        lines = [f"{'NAME':<32} {'STATUS':<11} {'CONTEXT':>8} MAX OUTPUT"]
        lines += [
            f"{r['name']:<32} {r['status']:<11} {r['context_length']:>8} "
            + ("context" if r["max_output_tokens"] is None else str(r["max_output_tokens"]))
            for r in rows
        ]
        return "\n".join(lines)

    echo_result(rows, as_json, text)


@models.command("set")
@click.argument("name")
@click.option(
    "--max-output-tokens",
    type=NoneOr(click.INT),
    required=True,
    help="Most output tokens one request may ask of the model (none: its context length).",
)
@json_option
@storage_options
def set_(name: str, max_output_tokens: int | Cleared, as_json: bool) -> None:
    """Set a registered model's output cap (1 to 10**7, at most its context length)."""
    from admin import registry

    value = None if isinstance(max_output_tokens, Cleared) else max_output_tokens
    with open_session() as (settings, session):
        row = registry.update_model(session, name=name, max_output_tokens=value)
        audit_change(session, settings, "model.update", f"models/{name}", max_output_tokens=value)
        data = model_dict(row)
    echo_result(
        data,
        as_json,
        lambda: (
            f"model {name}: max output tokens "
            + ("the context length" if value is None else str(value))
        ),
    )


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
