"""Admin: model registry and prices, LoRA adapters, shared prefixes, admin tokens, usage, audit.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenancy.models import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def _tenant_fk(name: str) -> sa.ForeignKey:
    return sa.ForeignKey("tenants.id", ondelete="CASCADE", name=name)


def upgrade() -> None:
    """Create the admin service's tables."""
    op.create_table(
        "registry_models",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("revision", sa.String(128), nullable=False),
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("context_length", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("allowed_tenants", sa.JSON(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("name", name="uq_registry_models_name"),
        sa.CheckConstraint(
            "status IN ('registered', 'loaded', 'retired')", name="ck_registry_models_status"
        ),
    )
    op.create_table(
        "model_prices",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model_name", sa.String(128), nullable=False),
        sa.Column("effective_from", UTCDateTime(), nullable=False),
        sa.Column("input_micros_per_m", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_micros_per_m", sa.BigInteger(), nullable=False),
        sa.Column("output_micros_per_m", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("model_name", "effective_from", name="uq_model_prices"),
    )
    op.create_index("ix_model_prices_model_name", "model_prices", ["model_name"])
    op.create_table(
        "lora_adapters",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("base_model", sa.String(128), nullable=False),
        sa.Column("owner_tenant_id", sa.String(32), _tenant_fk("fk_lora_owner"), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("source_path", sa.String(1024), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("name", name="uq_lora_adapters_name"),
        sa.CheckConstraint(
            "status IN ('registered', 'loaded', 'retired')", name="ck_lora_adapters_status"
        ),
    )
    op.create_index("ix_lora_adapters_owner_tenant_id", "lora_adapters", ["owner_tenant_id"])
    op.create_table(
        "shared_prefixes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("token_ids", sa.JSON(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("name", name="uq_shared_prefixes_name"),
    )
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("tenant_id", sa.String(32), _tenant_fk("fk_admin_tokens_tenant"), nullable=True),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("secret_hash", name="uq_admin_tokens_secret_hash"),
        sa.CheckConstraint(
            "role IN ('admin', 'viewer', 'tenant-admin')", name="ck_admin_tokens_role"
        ),
    )
    op.create_table(
        "usage_records",
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("occurred_at", UTCDateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("adapter", sa.String(128), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_pico_usd", sa.BigInteger(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("client_disconnected", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_usage_records_occurred_at", "usage_records", ["occurred_at"])
    op.create_index("ix_usage_records_tenant_time", "usage_records", ["tenant_id", "occurred_at"])
    op.create_table(
        "usage_hourly",
        sa.Column("hour", UTCDateTime(), primary_key=True),
        sa.Column("tenant_id", sa.String(32), primary_key=True),
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("adapter", sa.String(128), primary_key=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_pico_usd", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "audit_events",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("at", sa.String(40), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=True),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("resource", sa.String(512), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("source_ip", sa.String(64), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_table(
        "audit_checkpoints",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("record_hash", sa.String(64), nullable=False),
        sa.Column("prev_digest", sa.String(64), nullable=False),
        sa.Column("public_key", sa.String(64), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    """Drop the admin tables (tenancy's stay)."""
    op.drop_table("audit_checkpoints")
    op.drop_table("audit_events")
    op.drop_table("usage_hourly")
    op.drop_index("ix_usage_records_tenant_time", table_name="usage_records")
    op.drop_index("ix_usage_records_occurred_at", table_name="usage_records")
    op.drop_table("usage_records")
    op.drop_table("admin_tokens")
    op.drop_table("shared_prefixes")
    op.drop_index("ix_lora_adapters_owner_tenant_id", table_name="lora_adapters")
    op.drop_table("lora_adapters")
    op.drop_index("ix_model_prices_model_name", table_name="model_prices")
    op.drop_table("model_prices")
    op.drop_table("registry_models")
