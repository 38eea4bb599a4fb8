"""`cloister batches list`: a tenant's Batch API batches and their progress."""

from __future__ import annotations

from typing import Any

import click

from cloister.cli_context import echo_table, json_option, storage_options
from cloister.cli_db import session_factory


def batch_dict(info: Any) -> dict[str, Any]:
    """A batch's progress as JSON-ready values (the admin API's fields)."""
    counts = info.counts
    return {
        "id": info.id,
        "status": info.status,
        "endpoint": info.endpoint,
        "created_at": info.created_at.isoformat(),
        "total_lines": info.total_lines,
        "completed_lines": counts.completed,
        "failed_lines": counts.failed,
        "prompt_tokens": counts.prompt_tokens,
        "completion_tokens": counts.completion_tokens,
        "output_file_id": info.output_file_id,
        "error_file_id": info.error_file_id,
    }


@click.group("batches")
def batches() -> None:
    """Inspect tenants' Batch API batches."""


@batches.command("list")
@click.argument("tenant")
@click.option(
    "--limit", type=click.IntRange(1, 100), default=20, show_default=True, help="How many."
)
@json_option
@storage_options
def list_(tenant: str, limit: int, as_json: bool) -> None:
    """List TENANT's batches, newest first, with lines done and failed."""
    from gateway.batch_api.batch_store import BatchStore
    from tenancy import store

    with session_factory() as (_settings, sessions):
        with sessions() as session:
            tenant_id = store.get_tenant(session, tenant).id
        page, _ = BatchStore(sessions).page(tenant_id, limit=limit, after=None)
        rows = [batch_dict(b) for b in page]
    echo_table(
        rows,
        as_json,
        f"{'BATCH':<32} {'STATUS':<12} {'DONE':>7} {'FAILED':>7} {'TOTAL':>7} OUTPUT TOKENS",
        lambda r: (
            f"{r['id']:<32} {r['status']:<12} {r['completed_lines']:>7} {r['failed_lines']:>7}"
            f" {r['total_lines']:>7} {r['completion_tokens']}"
        ),
    )


commands: list[click.Command] = [batches]
