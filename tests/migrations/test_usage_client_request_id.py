"""Migration 0006 (usage_records.client_request_id) keeps usage both ways, and lets one
client id be stored for many records (retries, other tenants)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tenancy.db import downgrade_database, make_engine, upgrade_database

INSERT = (
    "INSERT INTO usage_records (request_id, occurred_at, tenant_id, key_id, model, adapter,"
    " prompt_tokens, cached_tokens, completion_tokens, cost_pico_usd, latency_s, status,"
    " client_disconnected, unpriced{extra_cols}) VALUES (:id, :n, :t, 'k', 'm', '', 3, 0, 2, 0,"
    " 0.1, 200, false, false{extra_vals})"
)


def _insert(conn: sa.Connection, request_id: str, tenant: str, client: str | None = None) -> None:
    with_client = client is not None
    sql = INSERT.format(
        extra_cols=", client_request_id" if with_client else "",
        extra_vals=", :c" if with_client else "",
    )
    conn.execute(
        sa.text(sql), {"id": request_id, "n": dt.datetime.now(dt.UTC), "t": tenant, "c": client}
    )


def _round_trip(url: str) -> None:
    upgrade_database(url, "0005")
    engine = make_engine(url)
    with engine.begin() as c:
        _insert(c, "cmpl-old", "ten_1")
    upgrade_database(url, "0006")
    inspector = sa.inspect(engine)
    assert "client_request_id" in {c["name"] for c in inspector.get_columns("usage_records")}
    indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("usage_records")}
    assert indexes["ix_usage_records_tenant_client_request"] == ["tenant_id", "client_request_id"]
    with engine.begin() as c:
        assert c.execute(sa.text("SELECT client_request_id FROM usage_records")).scalar() is None
        # The same client id from two tenants and twice from one: every record is kept.
        _insert(c, "cmpl-a1", "ten_1", "retry-1")
        _insert(c, "cmpl-a2", "ten_1", "retry-1")
        _insert(c, "cmpl-b1", "ten_2", "retry-1")
        found = c.execute(
            sa.text(
                "SELECT tenant_id, count(*) FROM usage_records WHERE client_request_id = 'retry-1'"
                " GROUP BY tenant_id ORDER BY tenant_id"
            )
        ).all()
        assert [tuple(r) for r in found] == [("ten_1", 2), ("ten_2", 1)]
    downgrade_database(url, "0005")
    assert "client_request_id" not in {
        c["name"] for c in sa.inspect(engine).get_columns("usage_records")
    }
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM usage_records")).scalar_one() == 4
    engine.dispose()
    upgrade_database(url)


def test_0006_round_trip(database_url: str) -> None:
    _round_trip(database_url)
