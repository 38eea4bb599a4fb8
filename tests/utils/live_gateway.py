"""Live gateways (uvicorn in a thread) on a free loopback port, with tenants and keys made
through tenancy's store, and the handles a test needs.

The engine is the real AsyncEngine over a tiny random-weight model; set
CLOISTER_GATEWAY_TEST_ENGINE=fake to run the same engine over the fast fake model
(tests/utils/fast_fake_model.py) instead.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from openai import OpenAI
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy.orm import Session, sessionmaker

from engine_hop.in_process import InProcessEngineClient
from gateway.app import create_app
from gateway.usage import UsageRecord
from server.logging_setup import configure_logging
from server.settings import Settings
from tenancy import store
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.limiter.base import Limiter
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER
from tests.utils.services import free_port

# What these gateways accept as an operator credential for the tenant series on /metrics
# (`cloister serve` checks admin tokens instead: tests/gateway/test_metrics_access.py).
OPERATOR_HEADERS = {"Authorization": "Bearer operator-test-token"}


def operator_auth(authorization: str) -> bool:
    """The test gateways' operator check."""
    return authorization == OPERATOR_HEADERS["Authorization"]


class ListUsageSink:
    """Keeps every usage record, for exactly-once assertions."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, usage: UsageRecord) -> None:
        """Appends."""
        self.records.append(usage)


def make_test_engine(tmp_path: Path) -> Any:
    """The engine under test: real tiny model by default, the fast fake model on request."""
    if os.environ.get("CLOISTER_GATEWAY_TEST_ENGINE") == "fake":
        return gateway_test_engine()
    from engine.fronts.async_engine import AsyncEngine
    from tests.utils.tiny_model import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path)
    return AsyncEngine.from_options(
        model=str(folder), max_model_len=512, num_blocks=256, attention_backend="torch"
    )


@dataclass
class LiveGateway:
    """A running server and the handles a test needs."""

    base_url: str
    model: str
    engine: Any
    sessions: sessionmaker[Session]
    usage: ListUsageSink
    logs: io.StringIO
    secrets: list[str] = field(default_factory=list)
    app: Any = None  # the ASGI app uvicorn serves (create_app's FastAPI)

    def client(self, key: str) -> OpenAI:
        """An OpenAI SDK client with this key and no retries."""
        return OpenAI(base_url=self.base_url + "/v1", api_key=key, max_retries=0, timeout=60)

    def tenant(self, name: str, *, isolation: str = "tenant", **limits: Any) -> str:
        """Creates a tenant with `limits` and one key; returns the key's secret."""
        with self.sessions() as s:
            store.create_tenant(s, name=name, isolation_level=isolation)
            if limits:
                store.set_limits(s, tenant_name=name, **limits)
        return self.key(name)

    def key(self, tenant: str, **kwargs: Any) -> str:
        """A new key of `tenant`."""
        with self.sessions() as s:
            created = store.create_key(s, tenant_name=tenant, pepper=PEPPER, **kwargs)
        self.secrets.append(created.secret)
        return created.secret

    def key_id(self, secret: str) -> str:
        """The id of the key whose secret is `secret`."""
        from tenancy.keys import find_key

        with self.sessions() as s:
            row = find_key(s, PEPPER, secret)
            assert row is not None
            return row.id


def start_gateway(
    tmp_path: Path,
    *,
    engine: Any,
    limiter: Limiter,
    refresh_s: float = 0.0,
    tracer_provider: TracerProvider | None = None,
    client: Any | None = None,
    **settings: Any,
) -> tuple[LiveGateway, Callable[[], None]]:
    """Starts uvicorn in a thread; returns the gateway and its stop function.

    `client` (an EngineClient, e.g. a remote one) replaces the in-process client of `engine`.

    `refresh_s` 0 makes revocations visible at once (tests); production caches rows.
    """
    url = f"sqlite:///{tmp_path / 'cloister.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    cfg = Settings(data_dir=tmp_path, key_pepper=PEPPER, config_refresh_s=refresh_s, **settings)
    usage = ListUsageSink()
    if client is None:
        client = InProcessEngineClient(engine, model_name="tiny")
    app = create_app(
        cfg,
        engine_client=client,
        authenticator=Authenticator(sessions, PEPPER, refresh_s=refresh_s),
        limiter=limiter,
        usage_sink=usage,
        tracer_provider=tracer_provider,
        operator_auth=operator_auth,
    )
    logs = io.StringIO()
    handler = configure_logging("INFO", stream=logs)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("gateway did not start")
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=30)
        logging.getLogger().removeHandler(handler)

    gw = LiveGateway(f"http://127.0.0.1:{port}", "tiny", engine, sessions, usage, logs, app=app)
    return gw, stop
