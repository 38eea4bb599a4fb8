"""What a migrated database holds, read back through SQLAlchemy's inspector."""

from __future__ import annotations

import sqlalchemy as sa

from tenancy.db import make_engine


def table_names(url: str) -> set[str]:
    """The tables of the database at `url`, Alembic's own version table left out."""
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()
