"""Batch lines (the Batch API) metered apart and billed at a per-price discount.

usage_records.batch: the request was a line of a tenant's batch. usage_hourly.batch
joins the rollup's primary key, so batch and interactive usage of one model are summed
apart (they are billed at different prices). model_prices.batch_discount_pct: the
percent taken off a batch line's cost at that price, 0 to 100. Existing rows: usage is
interactive (false), prices take the default discount (50).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenancy.models import UTCDateTime

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None

DISCOUNT_CHECK = "ck_model_prices_batch_discount_pct"
_OLD_KEY = ("hour", "tenant_id", "key_id", "model", "adapter", "status")
_SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_pico_usd",
    "unpriced_requests",
)


def _create_hourly(name: str, *, with_batch: bool) -> None:
    """usage_hourly as of 0013, with `batch` in the primary key or without it."""
    batch = [sa.Column("batch", sa.Boolean(), nullable=False, server_default=sa.false())]
    key = (*_OLD_KEY, "batch") if with_batch else _OLD_KEY
    op.create_table(
        name,
        sa.Column("hour", UTCDateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("adapter", sa.String(128), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False, server_default="200"),
        *(batch if with_batch else []),
        *(sa.Column(s, sa.BigInteger(), nullable=False) for s in _SUMS[:-1]),
        sa.Column("unpriced_requests", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint(*key, name=f"{name}_pkey"),
    )


def _rebuild_hourly(*, with_batch: bool) -> None:
    """Copies usage_hourly into a table with the new key, as 0003 did (SQLite cannot alter
    a primary key; one path for both databases keeps them alike). Without batch, each
    hour's batch rows fold into its interactive ones."""
    _create_hourly("usage_hourly_next", with_batch=with_batch)
    cols = ", ".join(_OLD_KEY)
    sums = ", ".join(_SUMS)
    if with_batch:
        op.execute(
            f"INSERT INTO usage_hourly_next ({cols}, batch, {sums}) "
            f"SELECT {cols}, false, {sums} FROM usage_hourly"
        )
    else:
        summed = ", ".join(f"SUM({s})" for s in _SUMS)
        op.execute(
            f"INSERT INTO usage_hourly_next ({cols}, {sums}) "
            f"SELECT {cols}, {summed} FROM usage_hourly GROUP BY {cols}"
        )
    op.drop_table("usage_hourly")
    op.rename_table("usage_hourly_next", "usage_hourly")
    if op.get_bind().dialect.name == "postgresql":  # keep the constraint's usual name
        op.execute(
            "ALTER TABLE usage_hourly RENAME CONSTRAINT usage_hourly_next_pkey TO usage_hourly_pkey"
        )


def upgrade() -> None:
    """Add the batch marks (existing usage: interactive) and the discount (existing: 50)."""
    op.add_column(
        "usage_records",
        sa.Column("batch", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    _rebuild_hourly(with_batch=True)
    # A batch rebuild on SQLite (for the CHECK) is safe: no table references model_prices.
    with op.batch_alter_table("model_prices") as batch:
        batch.add_column(
            sa.Column("batch_discount_pct", sa.Integer(), nullable=False, server_default="50")
        )
        batch.create_check_constraint(DISCOUNT_CHECK, "batch_discount_pct BETWEEN 0 AND 100")


def downgrade() -> None:
    """Drop them again: batch usage folds into interactive usage and keeps its stored
    (discounted) cost; the discounts are lost."""
    with op.batch_alter_table("model_prices") as batch:
        batch.drop_constraint(DISCOUNT_CHECK, type_="check")
        batch.drop_column("batch_discount_pct")
    _rebuild_hourly(with_batch=False)
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("batch")
