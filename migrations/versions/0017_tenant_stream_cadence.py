"""A tenant's stream cadence: how the gateway chunks its streamed text.

tenants.stream_cadence: "token" (each engine event's text as it comes: the behaviour of
every existing tenant, hence the server default) or "fixed:N" (chunks of exactly N
tokens, at most one per engine event), against the size and timing side channel of
speculative decoding. The store checks the value (tenancy.validation); the database
holds a short string.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the column, "token" for every existing tenant.

    Plain ADD COLUMN on both databases (no batch rebuild of `tenants`; see 0004 and
    0011). No CHECK: "fixed:N" has no portable SQL form, so the store's validation holds
    the format, as SQLite's columns of 0004 rely on it.
    """
    op.add_column(
        "tenants",
        sa.Column(
            "stream_cadence", sa.String(16), nullable=False, server_default=sa.text("'token'")
        ),
    )


def downgrade() -> None:
    """Drop it (SQLite >= 3.35 drops a column in place); every tenant streams per token."""
    op.drop_column("tenants", "stream_cadence")
