"""Prices per LoRA adapter.

model_prices.adapter: "" for the base model's own price (every existing row), else the
name of one of its adapters; an adapter without a price of its own is billed at its
base model's. The unique key becomes (model_name, adapter, effective_from), so an
adapter's price may start when its base model's does.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

UNIQUE = "uq_model_prices"


def upgrade() -> None:
    """Add the column (existing prices: the base model's) and widen the unique key.

    A batch rebuild is safe here: no table references model_prices."""
    column = sa.Column("adapter", sa.String(128), nullable=False, server_default="")
    with op.batch_alter_table("model_prices") as batch:
        batch.add_column(column)
        batch.drop_constraint(UNIQUE, type_="unique")
        batch.create_unique_constraint(UNIQUE, ["model_name", "adapter", "effective_from"])


def downgrade() -> None:
    """Drop the adapter prices and the column (their usage keeps its stored cost)."""
    op.execute(sa.text("DELETE FROM model_prices WHERE adapter <> ''"))
    with op.batch_alter_table("model_prices") as batch:
        batch.drop_constraint(UNIQUE, type_="unique")
        batch.create_unique_constraint(UNIQUE, ["model_name", "effective_from"])
        batch.drop_column("adapter")
