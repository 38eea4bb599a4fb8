"""Rows and columns for migration tests, in plain SQL: the ORM models describe only the
head schema, and these tests write rows at older revisions."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa


def columns(engine: sa.Engine, table: str) -> set[str]:
    """The names of `table`'s columns in the database as it is now."""
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def insert_row(conn: sa.Connection, table: str, values: dict[str, Any]) -> None:
    """Inserts one row of `values` (column: value) into `table`, as bound parameters."""
    names = ", ".join(values)
    params = ", ".join(f":{name}" for name in values)
    conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({params})"), values)


def insert_tenant(conn: sa.Connection, **extra: Any) -> None:
    """Inserts tenant "acme" (id "ten_1", active, weight 1.0, created now); `extra` adds
    or replaces columns, so a test names only those its revision has."""
    row = {
        "id": "ten_1",
        "name": "acme",
        "status": "active",
        "isolation_level": "tenant",
        "weight": 1.0,
        "created_at": dt.datetime.now(dt.UTC),
    }
    insert_row(conn, "tenants", {**row, **extra})


def insert_registry_model(conn: sa.Connection, **extra: Any) -> None:
    """Inserts loaded model "m" (id "mdl_1", a 512-token gguf, created now); `extra` adds
    or replaces columns."""
    row = {
        "id": "mdl_1",
        "name": "m",
        "revision": "main",
        "source": "/m",
        "format": "gguf",
        "context_length": 512,
        "status": "loaded",
        "created_at": dt.datetime.now(dt.UTC),
    }
    insert_row(conn, "registry_models", {**row, **extra})
