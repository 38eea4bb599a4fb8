"""The family and the storage type of each model a server loaded.

registry_models.family: engine.model.registry's name for the model's family ("qwen3",
"llama", ...); registry_models.quantization: how its matrices are stored ("Q4_K+Q6_K",
"BF16", "gptq", ...). Both set by `cloister serve` for what it loaded; NULL for rows
registered before, or by hand.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the two nullable columns (plain ADD COLUMN on both databases, as in 0012)."""
    op.add_column("registry_models", sa.Column("family", sa.String(32), nullable=True))
    op.add_column("registry_models", sa.Column("quantization", sa.String(64), nullable=True))


def downgrade() -> None:
    """Drop them (SQLite >= 3.35 drops a column in place)."""
    op.drop_column("registry_models", "quantization")
    op.drop_column("registry_models", "family")
