"""The admin app as `cloister admin serve` builds it from settings, for tests."""

from __future__ import annotations

from fastapi.testclient import TestClient

from admin.app import create_admin_app, make_services
from admin.deps import AdminServices
from admin.settings import AdminSettings
from server.settings import Settings
from tenancy.db import make_engine, make_session_factory


def admin_app_from_settings(settings: Settings) -> tuple[AdminServices, TestClient]:
    """The admin services over `settings`' (already migrated) database, with its pepper
    and admin settings, and a TestClient on the admin app they serve."""
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    services = make_services(
        sessions,
        pepper=settings.key_pepper.get_secret_value(),
        settings=AdminSettings.from_settings(settings),
    )
    return services, TestClient(create_admin_app(services))
