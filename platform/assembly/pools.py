"""The database connection pools one `cloister serve` process opens, each for one kind of
work, so that tenant traffic never waits on the admin API's or the writers' database use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker


@dataclass(frozen=True)
class DatabasePools:
    """A session factory per kind of work, each on its own connection pool."""

    gateway: sessionmaker[Session]  # the gateway's key reads (one connection per read thread)
    admin: sessionmaker[Session]  # the admin API's requests
    writers: sessionmaker[Session]  # the background writers: audit, metering, last_used_at
    access: sessionmaker[Session]  # the registry's allow-lists, read by the gateway
    batches: sessionmaker[Session]  # the Batch API's files, batches and line results


def open_pools(settings: Settings) -> DatabasePools:
    """Every pool, made before any connection is open: on SQLite, making an engine opens
    and closes the file, which would drop the locks open connections of this process hold."""
    from gateway.auth_cache import READ_THREADS
    from tenancy.db import make_engine, make_session_factory

    url = settings.resolved_database_url
    timeout_ms = int(settings.gateway.auth_read_timeout_s * 1000)
    return DatabasePools(
        gateway=make_session_factory(
            make_engine(
                url,
                pool_size=READ_THREADS,
                max_overflow=0,
                pool_timeout_s=settings.gateway.auth_read_timeout_s,
                statement_timeout_ms=timeout_ms,
            )
        ),
        admin=make_session_factory(
            make_engine(url, pool_size=settings.db_pool_size, max_overflow=settings.db_pool_size)
        ),
        writers=make_session_factory(make_engine(url, pool_size=3, max_overflow=2)),
        access=make_session_factory(
            make_engine(
                url,
                pool_size=1,
                max_overflow=0,
                pool_timeout_s=settings.gateway.auth_read_timeout_s,
                statement_timeout_ms=timeout_ms,
            )
        ),
        # Its own pool, so a batch's bookkeeping never waits on (or holds up) key reads
        # or the admin API.
        batches=make_session_factory(make_engine(url, pool_size=4, max_overflow=4)),
    )
