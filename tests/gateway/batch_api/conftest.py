"""The `batch_server` fixture: a `cloister serve` app (build_app) on the fast fake engine, with
tenants, for the Batch API (its client: tests/utils/batch_server.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from assembly.app import build_app
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.batch_server import (
    BatchServer,
)
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER


@pytest.fixture
def batch_server(tmp_path: Path) -> Iterator[Callable[..., BatchServer]]:
    """Starts a server with `tenants` (name -> limits) and settings overrides."""
    started: list[tuple[FastAPI, TestClient]] = []

    def start(
        tenants: dict[str, dict[str, Any]], *, engine: Any | None = None, **overrides: Any
    ) -> BatchServer:
        settings = Settings(
            data_dir=tmp_path / "data",
            key_pepper=PEPPER,
            model_name="fake",
            config_refresh_s=0.0,
            **overrides,
        )
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade_database(settings.resolved_database_url)
        sessions = make_session_factory(make_engine(settings.resolved_database_url))
        keys = {}
        with sessions() as s:
            for name, limits in tenants.items():
                store.create_tenant(s, name=name)
                if limits:
                    store.set_limits(s, tenant_name=name, **limits)
                keys[name] = store.create_key(s, tenant_name=name, pepper=PEPPER).secret
        app = build_app(settings, engine=engine or gateway_test_engine())
        client = TestClient(app)
        client.__enter__()
        started.append((app, client))
        return BatchServer(app, client, keys, sessions, settings.data_dir)

    yield start
    for app, client in started:
        client.__exit__(None, None, None)
        for writer in app.state.background_writers:
            writer.close()
        app.state.metering.close()
