"""Roles operator, finance and auditor for admin tokens; the actor's name on audit records.

admin_tokens.role: its CHECK admits the three new roles (SQLite rebuilds the table:
nothing references admin_tokens, so no cascade runs). audit_events.actor_name: the
display name of who acted (a token's name, an OIDC name), hashed only when set, so
earlier records keep their hash.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenancy.models import UTCDateTime

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

OLD_ROLES = ("admin", "viewer", "tenant-admin")
NEW_ROLES = ("admin", "operator", "viewer", "finance", "auditor", "tenant-admin")
CHECK = "ck_admin_tokens_role"


def _condition(roles: tuple[str, ...]) -> str:
    return "role IN (" + ", ".join(f"'{r}'" for r in roles) + ")"


def _tokens_table(roles: tuple[str, ...]) -> sa.Table:
    """admin_tokens as 0002 made it, with the role CHECK for `roles` (SQLite's copy)."""
    return sa.Table(
        "admin_tokens",
        sa.MetaData(),
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column(
            "tenant_id",
            sa.String(32),
            sa.ForeignKey("tenants.id", ondelete="CASCADE", name="fk_admin_tokens_tenant"),
            nullable=True,
        ),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("secret_hash", name="uq_admin_tokens_secret_hash"),
        sa.CheckConstraint(_condition(roles), name=CHECK),
    )


def _set_roles(old: tuple[str, ...], new: tuple[str, ...]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table(
            "admin_tokens", copy_from=_tokens_table(old), recreate="always"
        ) as batch:
            batch.drop_constraint(CHECK, type_="check")
            batch.create_check_constraint(CHECK, _condition(new))
    else:
        op.drop_constraint(CHECK, "admin_tokens", type_="check")
        op.create_check_constraint(CHECK, "admin_tokens", _condition(new))


def upgrade() -> None:
    """Admit the new roles; add the nullable actor_name (earlier records: none)."""
    _set_roles(OLD_ROLES, NEW_ROLES)
    op.add_column("audit_events", sa.Column("actor_name", sa.String(256), nullable=True))


def downgrade() -> None:
    """Drop actor_name; delete tokens of the new roles (the old CHECK cannot hold them:
    removing a credential fails closed), then restore the old CHECK.

    Records written with a name were hashed with it and no longer verify once it is
    gone: export the audit log (`cloister audit export`) before downgrading.
    """
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("actor_name")
    extra = tuple(r for r in NEW_ROLES if r not in OLD_ROLES)
    op.execute(
        sa.text("DELETE FROM admin_tokens WHERE role IN :roles").bindparams(
            sa.bindparam("roles", value=list(extra), expanding=True)
        )
    )
    _set_roles(NEW_ROLES, OLD_ROLES)
