"""The database before anything serves: the data directory, the migrations, and the
check that this process holds the secrets the deployment was set up with.
"""

from __future__ import annotations

from server.settings import Settings, private_data_dir


def prepare_database(settings: Settings) -> bool:
    """Creates the data dir, migrates the database and checks that this process holds the
    secrets it was set up with (`SecretMismatchError` if not); True when it has no tenant
    yet."""
    from sqlalchemy import func, select

    from assembly.deployment_secrets import check_deployment_secrets
    from tenancy.db import make_engine, make_session_factory, upgrade_database
    from tenancy.models import Tenant

    private_data_dir(settings.data_dir)
    url = settings.resolved_database_url
    upgrade_database(url)
    engine = make_engine(url)
    try:
        check_deployment_secrets(settings, make_session_factory(engine))
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Tenant)).scalar_one()) == 0
    finally:
        engine.dispose()
