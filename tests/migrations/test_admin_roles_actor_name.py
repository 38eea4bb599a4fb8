"""Migration 0007 (roles operator/finance/auditor, audit actor_name) keeps data both ways."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database
from tests.utils.migration_rows import columns

TOKEN = (
    "INSERT INTO admin_tokens (id, name, role, tenant_id, prefix, secret_hash, created_at)"
    " VALUES (:id, 'n', :role, NULL, 'clo-adm-x', :h, :n)"
)


def _token(c: sa.Connection, id_: str, role: str) -> None:
    c.execute(
        sa.text(TOKEN), {"id": id_, "role": role, "h": "h" + id_, "n": dt.datetime.now(dt.UTC)}
    )


def _round_trip(url: str) -> None:
    upgrade_database(url, "0006")
    engine = make_engine(url)
    with engine.begin() as c:
        _token(c, "adm_1", "viewer")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
        _token(c, "adm_x", "operator")  # 0006 refuses the new roles
    upgrade_database(url, "0007")
    assert "actor_name" in columns(engine, "audit_events")
    with engine.begin() as c:
        for i, role in enumerate(("operator", "finance", "auditor")):
            _token(c, f"adm_n{i}", role)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
        _token(c, "adm_y", "root")  # still a closed list
    with engine.connect() as c:
        roles = c.execute(sa.text("SELECT role FROM admin_tokens ORDER BY id")).scalars().all()
    assert roles == ["viewer", "operator", "finance", "auditor"]
    downgrade_database(url, "0006")
    assert "actor_name" not in columns(engine, "audit_events")
    with engine.connect() as c:
        # Tokens of roles the old schema cannot hold are gone; the others are kept.
        assert c.execute(sa.text("SELECT id, role FROM admin_tokens")).all() == [
            ("adm_1", "viewer")
        ]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
        _token(c, "adm_z", "finance")
    engine.dispose()
    upgrade_database(url)


def test_0007_round_trip(database_url: str) -> None:
    _round_trip(database_url)
