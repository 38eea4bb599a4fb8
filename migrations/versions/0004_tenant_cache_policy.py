"""Per-tenant cache policy: floor (blocks or share of the pool), retention TTL, scrub-on-free
and never-cache.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

_CHECKS = (
    ("ck_tenants_cache_floor_blocks", "cache_floor_blocks IS NULL OR cache_floor_blocks >= 0"),
    (
        "ck_tenants_cache_floor_share",
        "cache_floor_share IS NULL OR (cache_floor_share >= 0 AND cache_floor_share <= 1)",
    ),
    ("ck_tenants_retention_ttl", "retention_ttl_s IS NULL OR retention_ttl_s > 0"),
)
_COLUMNS = ("cache_floor_blocks", "cache_floor_share", "retention_ttl_s", "scrub_on_free")


def upgrade() -> None:
    """Add the policy columns (existing tenants: engine defaults, caching on).

    Plain ADD COLUMN on both databases: a batch rebuild of `tenants` on SQLite would drop
    the table, and with foreign keys on that cascades to every key and limit. SQLite
    cannot add a CHECK to an existing table, so there the store's validation alone holds
    the bounds; PostgreSQL gets the constraints too.
    """
    op.add_column("tenants", sa.Column("cache_floor_blocks", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("cache_floor_share", sa.Float(), nullable=True))
    op.add_column("tenants", sa.Column("retention_ttl_s", sa.Float(), nullable=True))
    op.add_column("tenants", sa.Column("scrub_on_free", sa.Boolean(), nullable=True))
    op.add_column(
        "tenants",
        sa.Column("never_cache", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    if op.get_bind().dialect.name == "postgresql":
        for name, condition in _CHECKS:
            op.create_check_constraint(name, "tenants", condition)


def downgrade() -> None:
    """Drop the policy columns (SQLite >= 3.35 drops a column in place)."""
    if op.get_bind().dialect.name == "postgresql":
        for name, _ in _CHECKS:
            op.drop_constraint(name, "tenants", type_="check")
    for column in (*_COLUMNS, "never_cache"):
        op.drop_column("tenants", column)
