"""Alembic environment: the URL comes from the Config (tenancy.db) or CLOISTER_DATABASE_URL."""

from __future__ import annotations

import os

from alembic import context

import admin.models  # noqa: F401  (registers the admin tables on Base.metadata)
import gateway.batch_api.tables  # noqa: F401  (the Batch API's tables)
from tenancy.db import make_engine
from tenancy.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("CLOISTER_DATABASE_URL")
    if not url:
        raise RuntimeError("set sqlalchemy.url or CLOISTER_DATABASE_URL")
    return url


def run_offline() -> None:
    """Emit SQL without a connection (`alembic upgrade head --sql`)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate over a live connection; batch mode on SQLite for ALTER TABLE."""
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
