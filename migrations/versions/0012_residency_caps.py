"""Bounded residency: a model's own output cap and a cap on a tenant's tokens in flight.

registry_models.max_output_tokens: NULL (the model's context length caps output, as
before) or the most output tokens one request may ask of the model.
limits.max_tokens_in_flight: NULL (unlimited, as before) or the most prompt + max output
tokens the tenant's (or, on a key's row, the key's) admitted, unfinished requests may
hold together.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the two nullable columns (existing models and limits: no new cap).

    Plain ADD COLUMN on both databases (no batch rebuild; see 0004 and 0011); the bounds
    are the store's and the registry's checks, as for the other limits.
    """
    op.add_column("registry_models", sa.Column("max_output_tokens", sa.Integer(), nullable=True))
    op.add_column("limits", sa.Column("max_tokens_in_flight", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop them (SQLite >= 3.35 drops a column in place); the caps are gone."""
    op.drop_column("limits", "max_tokens_in_flight")
    op.drop_column("registry_models", "max_output_tokens")
