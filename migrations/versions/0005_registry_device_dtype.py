"""The device and dtype a server loaded each model with; usage marked unpriced.

registry_models.device / dtype: set by `cloister serve` for the model it loaded,
cleared when it goes back to registered. usage_records.unpriced and
usage_hourly.unpriced_requests: usage of a model with no price in force at the time
(billed $0, but never silently: the billing export and the console mark it).

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable device/dtype columns and the unpriced marks (existing usage: priced)."""
    op.add_column("registry_models", sa.Column("device", sa.String(32), nullable=True))
    op.add_column("registry_models", sa.Column("dtype", sa.String(16), nullable=True))
    op.add_column(
        "usage_records",
        sa.Column("unpriced", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column(
        "usage_hourly",
        sa.Column("unpriced_requests", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    """Drop them again (batch mode: SQLite rebuilds the tables)."""
    with op.batch_alter_table("usage_hourly") as batch:
        batch.drop_column("unpriced_requests")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("unpriced")
    with op.batch_alter_table("registry_models") as batch:
        batch.drop_column("dtype")
        batch.drop_column("device")
