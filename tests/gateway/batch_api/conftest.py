"""A `cloister serve` app (build_app) on the fake engine, with tenants, for the Batch API."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.settings import Settings
from server.wiring import build_app
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.gateway.conftest import PEPPER
from tests.gateway.fakes import FakeEngine


@dataclass
class BatchServer:
    """A live app, its client, the tenants' keys and a session factory on its database."""

    app: FastAPI
    client: TestClient
    keys: dict[str, str]
    sessions: Any
    data_dir: Path

    def headers(self, tenant: str) -> dict[str, str]:
        """The bearer header of `tenant`'s key."""
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def upload(self, tenant: str, content: bytes, *, purpose: str = "batch") -> Any:
        """POSTs a file as the openai SDK does (multipart: file + purpose)."""
        return self.client.post(
            "/v1/files",
            headers=self.headers(tenant),
            files={"file": ("input.jsonl", content, "application/jsonl")},
            data={"purpose": purpose},
        )

    def wait_batch(self, tenant: str, batch_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Polls the batch until it ends; its last object."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.client.get(f"/v1/batches/{batch_id}", headers=self.headers(tenant))
            assert r.status_code == 200, r.text
            batch: dict[str, Any] = r.json()
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return batch
            assert time.monotonic() < deadline, batch
            time.sleep(0.05)

    def lines_of(self, tenant: str, file_id: str) -> list[dict[str, Any]]:
        """The JSON lines of a file, read through the API."""
        r = self.client.get(f"/v1/files/{file_id}/content", headers=self.headers(tenant))
        assert r.status_code == 200, r.text
        return [json.loads(line) for line in r.content.splitlines() if line.strip()]


def chat_line(custom_id: str, text: str, **body: Any) -> bytes:
    """One input line for /v1/chat/completions."""
    request = {"model": "fake", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    request.update(body)
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": request,
    }
    return json.dumps(line).encode() + b"\n"


@pytest.fixture
def batch_server(tmp_path: Path) -> Iterator[Callable[..., BatchServer]]:
    """Starts a server with `tenants` (name -> limits) and settings overrides."""
    started: list[tuple[FastAPI, TestClient]] = []

    def start(
        tenants: dict[str, dict[str, Any]], *, engine: FakeEngine | None = None, **overrides: Any
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
        app = build_app(settings, engine=engine or FakeEngine())
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
