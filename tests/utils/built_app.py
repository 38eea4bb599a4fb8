"""Helpers for tests of the assembled app (`assembly.app.build_app`): its database, its
first tenants and admin, an SDK over its TestClient, polling, and its shutdown."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from admin.identity import create_admin_token
from assembly.database import prepare_database
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.principals import PEPPER


def fake_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for `build_app` over the fast fake engine (model "fake"): rows re-read at
    once, no auth-failure limit; `overrides` replace or add settings."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "key_pepper": PEPPER,
        "model_name": "fake",
        "config_refresh_s": 0.0,
        "auth_failure_limit": 0,
    }
    return Settings(**{**values, **overrides})


def tiny_model_app(tmp_path: Path, **engine: Any) -> tuple[TestClient, str]:
    """The real app (not yet started) on a tiny random-weight model named "tiny", with a
    small KV pool, and one tenant key; `engine` adds or replaces settings."""
    from assembly.app import build_app
    from tests.utils.tiny_model import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "models")
    values: dict[str, Any] = {
        "data_dir": tmp_path,
        "key_pepper": PEPPER,
        "config_refresh_s": 0.0,
        "model": str(folder),
        "model_name": "tiny",
        "max_model_len": 1024,
        "kv_cache_bytes": 4 * 1024 * 1024,
        "log_level": "WARNING",
    }
    settings = Settings(**{**values, **engine})
    prepare_database(settings)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    with sessions() as s:
        store.create_tenant(s, name="acme")
        key = store.create_key(s, tenant_name="acme", pepper=PEPPER).secret
    return TestClient(build_app(settings)), key


def migrated_sessions(settings: Settings) -> sessionmaker[Session]:
    """Migrates the settings' database; returns a session factory over it."""
    upgrade_database(settings.resolved_database_url)
    return make_session_factory(make_engine(settings.resolved_database_url))


def tenant_keys(sessions: sessionmaker[Session], names: tuple[str, ...]) -> dict[str, str]:
    """Tenants `names` with one key each: their secrets by tenant name."""
    keys = {}
    with sessions() as s:
        for name in names:
            store.create_tenant(s, name=name)
            keys[name] = store.create_key(s, tenant_name=name, pepper=PEPPER).secret
    return keys


def admin_secret(sessions: sessionmaker[Session]) -> str:
    """A new admin token's secret."""
    with sessions() as s:
        return create_admin_token(s, pepper=PEPPER, role="admin").secret


def prepared_sessions(settings: Settings) -> sessionmaker[Session]:
    """Prepares the settings' database as `cloister serve` does; returns a session factory."""
    prepare_database(settings)
    return make_session_factory(make_engine(settings.resolved_database_url))


def chat_hi(client: TestClient, key: str, model: str) -> Any:
    """One chat completion of "hi" on `model` with tenant key `key`; the response."""
    return client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
    )


def alpha_beta_and_admin(sessions: sessionmaker[Session]) -> tuple[str, str, str]:
    """Tenants "alpha" and "beta" with one key each, and an admin token: their secrets."""
    with sessions() as s:
        store.create_tenant(s, name="alpha")
        store.create_tenant(s, name="beta")
        key_a = store.create_key(s, tenant_name="alpha", pepper=PEPPER).secret
        key_b = store.create_key(s, tenant_name="beta", pepper=PEPPER).secret
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
    return key_a, key_b, admin


def sdk_over(client: TestClient, key: str) -> openai.OpenAI:
    """An OpenAI SDK client with tenant key `key` over an in-process TestClient, no retries."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0
    )


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Polls `condition` every 0.1 s; fails with `what` if it is not true within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def close_app(app: Any) -> None:
    """Closes the app's background writers and its metering (what its tests leave open)."""
    for writer in app.state.background_writers:
        writer.close()
    app.state.metering.close()
