"""Gateways for the model-fallback tests: "big" falls back to "small" in the registry,
both priced, "small" allowed to "acme" only, served by `create_app` over the real
registry reader and metering (SQLite in the test's folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.metering import MeteringSink
from admin.models import UsageRow
from assembly.served_models import registry_model_access
from gateway.app import create_app
from server.settings import Settings
from tenancy import store
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import OPERATOR_HEADERS, operator_auth
from tests.utils.principals import PEPPER

# Micro-USD per million tokens: the fallback's price is what its usage must cost.
SMALL_PRICE = registry.Prices(input=7, cached_input=7, output=11)
BIG_PRICE = registry.Prices(input=1_000, cached_input=1_000, output=3_000)


def sqlite_sessions(tmp_path: Path) -> sessionmaker[Session]:
    """A migrated SQLite database in `tmp_path` and its session factory."""
    url = f"sqlite:///{tmp_path / 'cloister.db'}"
    upgrade_database(url)
    return make_session_factory(make_engine(url))


def register_big_falling_back_to_small(s: Session, names: tuple[str, ...], acme: str) -> None:
    """Registers `names` (among them "big" and "small"), prices big and small, makes small
    big's fallback and allows small to tenant id `acme` only ("other" may use big but
    not its fallback)."""
    for name in names:
        registry.register_model(s, name=name, source="/m", format="gguf", context_length=512)
    registry.set_price(s, model="big", prices=BIG_PRICE)
    registry.set_price(s, model="small", prices=SMALL_PRICE)
    registry.update_model(s, name="big", fallback_model="small")
    registry.update_model(s, name="small", allowed_tenants=[acme])


def fallback_count(client: TestClient) -> float:
    """The operators' /metrics count of requests "big" sent on to its fallback "small"."""
    text = client.get("/metrics", headers=OPERATOR_HEADERS).text
    for line in text.splitlines():
        if line.startswith('cloister:fallback_requests_total{fallback="small",model_name="big"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class MeteredGateway:
    """The gateway app over `engines`, the registry reader and metering; subclasses set
    `sessions` and seed the database before calling `serve`."""

    sessions: sessionmaker[Session]
    metering: MeteringSink
    access: Any
    app: Any

    def serve(self, tmp_path: Path, engines: dict[str, Any]) -> None:
        """Builds `app` over the engine clients `engines` (model name to client)."""
        settings = Settings(data_dir=tmp_path, key_pepper=PEPPER, config_refresh_s=0.0)
        self.metering = MeteringSink(self.sessions, tmp_path / "spool.jsonl", fsync=False).start()
        self.access = registry_model_access(settings, self.sessions)
        self.app = create_app(
            settings,
            engines=engines,
            authenticator=Authenticator(self.sessions, PEPPER, refresh_s=0.0),
            limiter=MemoryLimiter(),
            usage_sink=self.metering,
            operator_auth=operator_auth,
            model_access=self.access,
        )

    def new_key(self, tenant: str, **kwargs: Any) -> str:
        """A new key of `tenant`."""
        with self.sessions() as s:
            return store.create_key(s, tenant_name=tenant, pepper=PEPPER, **kwargs).secret

    def usage(self) -> list[UsageRow]:
        """Every usage row, once metering wrote what it was given."""
        assert self.metering.flush()
        with self.sessions() as s:
            return list(s.scalars(select(UsageRow).order_by(UsageRow.occurred_at)).all())

    def close(self) -> None:
        """Stops the metering thread and the registry reader."""
        self.metering.close()
        self.access.close()
