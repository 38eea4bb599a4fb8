"""Tenancy: tenants, api_keys, limits.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenancy.models import UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the three tenancy tables."""
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="active"),
        sa.Column("isolation_level", sa.String(16), nullable=False, server_default="tenant"),
        sa.Column("weight", sa.Float(), nullable=False, server_default="1.0"),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("name", name="uq_tenants_name"),
        sa.CheckConstraint("status IN ('active', 'suspended')", name="ck_tenants_status"),
        sa.CheckConstraint(
            "isolation_level IN ('tenant', 'key', 'user')", name="ck_tenants_isolation"
        ),
        sa.CheckConstraint("weight > 0", name="ck_tenants_weight"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "tenant_id",
            sa.String(32),
            sa.ForeignKey("tenants.id", ondelete="CASCADE", name="fk_api_keys_tenant"),
            nullable=False,
        ),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.Column("last_used_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.create_table(
        "limits",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "tenant_id",
            sa.String(32),
            sa.ForeignKey("tenants.id", ondelete="CASCADE", name="fk_limits_tenant"),
            nullable=False,
        ),
        sa.Column(
            "key_id",
            sa.String(32),
            sa.ForeignKey("api_keys.id", ondelete="CASCADE", name="fk_limits_key"),
            nullable=True,
        ),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("token_budget", sa.Integer(), nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("max_output_tokens", sa.Integer(), nullable=True),
        sa.Column("max_prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "budget_period IS NULL OR budget_period IN ('day', 'month')",
            name="ck_limits_budget_period",
        ),
    )
    op.create_index(
        "uq_limits_tenant",
        "limits",
        ["tenant_id"],
        unique=True,
        sqlite_where=sa.text("key_id IS NULL"),
        postgresql_where=sa.text("key_id IS NULL"),
    )
    op.create_index(
        "uq_limits_key",
        "limits",
        ["key_id"],
        unique=True,
        sqlite_where=sa.text("key_id IS NOT NULL"),
        postgresql_where=sa.text("key_id IS NOT NULL"),
    )


def downgrade() -> None:
    """Drop the tenancy tables, dependents first."""
    op.drop_index("uq_limits_key", table_name="limits")
    op.drop_index("uq_limits_tenant", table_name="limits")
    op.drop_table("limits")
    op.drop_index("ix_api_keys_tenant_id", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
