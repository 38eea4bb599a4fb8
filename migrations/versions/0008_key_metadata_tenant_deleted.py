"""API-key metadata and soft-deleted tenants.

api_keys.metadata: a small JSON object of the operator's labels (checked by the store).
tenants.deleted_at: set by `cloister tenants delete`; the row stays, suspended and with
its keys revoked, so that usage, billing lines and audit records keep their tenant.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add both nullable columns (existing keys: no metadata; existing tenants: not deleted).

    Plain ADD COLUMN on both databases: a batch rebuild of `tenants` on SQLite would drop
    the table, and with foreign keys on that cascades to every key and limit (see 0004).
    """
    op.add_column("api_keys", sa.Column("metadata", sa.JSON(), nullable=True))
    op.add_column("tenants", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop them again (SQLite >= 3.35 drops a column in place). A deleted tenant stays
    suspended, its keys revoked."""
    op.drop_column("tenants", "deleted_at")
    op.drop_column("api_keys", "metadata")
