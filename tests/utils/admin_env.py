"""An admin environment for tests: a migrated database, admin services over it, a TestClient
on the admin app, and admin tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from admin.app import create_admin_app, make_services
from admin.deps import AdminServices
from admin.identity import create_admin_token
from admin.settings import AdminSettings
from tenancy.db import make_engine, make_session_factory, upgrade_database

PEPPER = "admin-test-pepper"
SIGNING_SEED = "5a" * 32


@dataclass
class AdminEnv:
    """A migrated database, services over it, and a client."""

    url: str
    sessions: sessionmaker[Session]
    services: AdminServices
    client: TestClient
    tmp: Path

    def token(self, role: str, tenant: str | None = None) -> dict[str, str]:
        """Authorization headers for a fresh admin token."""
        with self.sessions() as s:
            created = create_admin_token(s, pepper=PEPPER, role=role, tenant_name=tenant)
        return {"Authorization": f"Bearer {created.secret}"}


def make_env(tmp_path: Path, url: str | None = None, **settings: object) -> AdminEnv:
    """An AdminEnv on `url` (default: SQLite in tmp_path)."""
    url = url or f"sqlite:///{tmp_path / 'admin.db'}"
    # The matrix tests send hundreds of bad credentials from one client; the throttle
    # has tests of its own (test_admin_flood.py).
    settings.setdefault("auth_failure_limit", 0)
    upgrade_database(url)
    (tmp_path / "models").mkdir(exist_ok=True)
    settings.setdefault("model_roots", (tmp_path / "models",))
    sessions = make_session_factory(make_engine(url))
    admin_settings = AdminSettings(
        audit_signing_key=SIGNING_SEED,  # type: ignore[arg-type]
        spool_path=tmp_path / "spool.jsonl",
        audit_checkpoint_every=5,
        **settings,  # type: ignore[arg-type]
    )
    services = make_services(sessions, pepper=PEPPER, settings=admin_settings)
    return AdminEnv(url, sessions, services, TestClient(create_admin_app(services)), tmp_path)
