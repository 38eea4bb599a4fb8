"""The client's x-request-id beside each usage record.

usage_records.client_request_id: the id a client sent in `x-request-id`, if valid.
Not unique (a retry reuses it, another tenant may pick the same): request_id stays
the key, and the client's id is looked up per tenant, hence the (tenant_id,
client_request_id) index. Existing rows: NULL (no client id was kept).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

INDEX = "ix_usage_records_tenant_client_request"


def upgrade() -> None:
    """Add the nullable column and its per-tenant index."""
    op.add_column("usage_records", sa.Column("client_request_id", sa.String(128), nullable=True))
    op.create_index(INDEX, "usage_records", ["tenant_id", "client_request_id"])


def downgrade() -> None:
    """Drop them again (batch mode: SQLite rebuilds the table)."""
    op.drop_index(INDEX, table_name="usage_records")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("client_request_id")
