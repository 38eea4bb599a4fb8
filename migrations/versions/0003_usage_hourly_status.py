"""Usage rollups keyed by HTTP status, so refused requests are counted apart with zero tokens.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenancy.models import UTCDateTime

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_KEY = ("hour", "tenant_id", "key_id", "model", "adapter")
_NEW_KEY = (*_OLD_KEY, "status")
_SUMS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_pico_usd")


def _create(name: str, *, with_status: bool) -> None:
    key = _NEW_KEY if with_status else _OLD_KEY
    status = [sa.Column("status", sa.Integer(), nullable=False, server_default="200")]
    op.create_table(
        name,
        sa.Column("hour", UTCDateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("adapter", sa.String(128), nullable=False),
        *(status if with_status else []),
        *(sa.Column(s, sa.BigInteger(), nullable=False) for s in _SUMS),
        sa.PrimaryKeyConstraint(*key, name=f"{name}_pkey"),
    )


def _rebuild(*, with_status: bool) -> None:
    """Copies usage_hourly into a table with the new key (SQLite cannot alter a primary key;
    one path for both databases keeps them alike). Without status, statuses fold together."""
    _create("usage_hourly_next", with_status=with_status)
    cols = ", ".join(_OLD_KEY)
    if with_status:
        op.execute(
            f"INSERT INTO usage_hourly_next ({cols}, status, {', '.join(_SUMS)}) "
            f"SELECT {cols}, 200, {', '.join(_SUMS)} FROM usage_hourly"
        )
    else:
        sums = ", ".join(f"SUM({s})" for s in _SUMS)
        op.execute(
            f"INSERT INTO usage_hourly_next ({cols}, {', '.join(_SUMS)}) "
            f"SELECT {cols}, {sums} FROM usage_hourly GROUP BY {cols}"
        )
    op.drop_table("usage_hourly")
    op.rename_table("usage_hourly_next", "usage_hourly")
    if op.get_bind().dialect.name == "postgresql":  # keep the constraint's usual name
        op.execute(
            "ALTER TABLE usage_hourly RENAME CONSTRAINT usage_hourly_next_pkey TO usage_hourly_pkey"
        )


def upgrade() -> None:
    """Add usage_hourly.status (existing rows: 200) as part of the primary key."""
    _rebuild(with_status=True)


def downgrade() -> None:
    """Fold the per-status rows back into one row per old key."""
    _rebuild(with_status=False)
