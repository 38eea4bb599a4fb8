"""Per-tenant KV quota: the most KV blocks a tenant's running sequences may hold.

tenants.kv_quota_blocks: NULL (no quota, the default for every existing tenant) or a
positive number of blocks, pushed to the engine with the rest of the cache policy.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None

_CHECK = ("ck_tenants_kv_quota_blocks", "kv_quota_blocks IS NULL OR kv_quota_blocks >= 1")


def upgrade() -> None:
    """Add the nullable column (existing tenants: no quota).

    Plain ADD COLUMN on both databases: a batch rebuild of `tenants` on SQLite would drop
    the table, and with foreign keys on that cascades to every key and limit (see 0004).
    SQLite cannot add a CHECK to an existing table, so there the store's validation alone
    holds the bound; PostgreSQL gets the constraint too.
    """
    op.add_column("tenants", sa.Column("kv_quota_blocks", sa.Integer(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.create_check_constraint(_CHECK[0], "tenants", _CHECK[1])


def downgrade() -> None:
    """Drop the quota (SQLite >= 3.35 drops a column in place); tenants run uncapped."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(_CHECK[0], "tenants", type_="check")
    op.drop_column("tenants", "kv_quota_blocks")
