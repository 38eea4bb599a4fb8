"""A model's fallback for overload.

registry_models.fallback_model: the name of the registered model that answers, once,
an interactive request this model's engine queue refuses as overloaded; NULL (every
row registered before) for none. The admin API keeps it a registered model's name,
never the model itself nor a cycle.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column (plain ADD COLUMN on both databases, as in 0013)."""
    op.add_column("registry_models", sa.Column("fallback_model", sa.String(128), nullable=True))


def downgrade() -> None:
    """Drop it (SQLite >= 3.35 drops a column in place)."""
    op.drop_column("registry_models", "fallback_model")
