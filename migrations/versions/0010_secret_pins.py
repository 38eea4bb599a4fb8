"""Fingerprints of the deployment's secrets (tenancy.secret_pins).

Every gateway and CLI that shares a database must hold the same key pepper, console
session key and audit signing key; the first to use the database pins a fingerprint of
each (an HMAC of a fixed label, or the audit key's public key), later ones are
compared with it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the empty table: the next process to start pins its secrets."""
    op.create_table(
        "secret_pins",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("fingerprint", sa.String(128), nullable=False),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    """Drop the pins (the secrets themselves were never here)."""
    op.drop_table("secret_pins")
