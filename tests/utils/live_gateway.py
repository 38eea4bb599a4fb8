"""Live gateways (uvicorn in a thread) on a free loopback port, with tenants and keys made
through tenancy's store, and the handles a test needs.

The engine is the real AsyncEngine over a tiny random-weight model; set
CLOISTER_GATEWAY_TEST_ENGINE=fake to run the same engine over the fast fake model
(tests/utils/fast_fake_model.py) instead.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from openai import OpenAI
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy.orm import Session, sessionmaker

from engine_hop.in_process import InProcessEngineClient
from engine_server.link import UVICORN_WS
from gateway.app import create_app
from gateway.usage import UsageRecord
from server.logging_setup import configure_logging
from server.settings import Settings
from tenancy import store
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.limiter.base import Limiter
from tenancy.limiter.memory import MemoryLimiter
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

    def records(self, request_id: str) -> list[UsageRecord]:
        """The usage records of the gateway's request id `request_id` so far."""
        return [r for r in self.usage.records if r.request_id == request_id]

    def key_id(self, secret: str) -> str:
        """The id of the key whose secret is `secret`."""
        from tenancy.keys import find_key

        with self.sessions() as s:
            row = find_key(s, PEPPER, secret)
            assert row is not None
            return row.id


def leave_stream_early(stream: Any, chunks: int = 3) -> str:
    """Reads an SDK stream's first chunk and `chunks` more, then closes it (the client
    leaves); returns the first chunk's id, the request's id."""
    read = iter(stream)
    first = next(read)
    for _ in range(chunks):
        next(read)
    stream.close()
    return str(first.id)


def hold_streams(client: OpenAI, messages: list[dict[str, str]], n: int = 2) -> list[Any]:
    """Opens `n` greedy chat streams of up to 400 tokens on model "tiny" and reads the
    first chunk of each, so that each holds its concurrency slot; returns the streams."""
    streams = [
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=400, stream=True, temperature=0
        )
        for _ in range(n)
    ]
    for s in streams:
        next(iter(s))  # holds its slot now
    return streams


def stream_chat(
    client: OpenAI, messages: Any, *, max_tokens: int, model: str = "tiny", **extra: Any
) -> tuple[list[Any], str]:
    """Streams a greedy chat reply with its usage chunk to the end; returns the chunks and
    the text their deltas carry. `extra` goes to the SDK (e.g. `seed`)."""
    create: Any = client.chat.completions.create  # the SDK's overloads do not take **extra
    chunks = list(
        create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            **extra,
        )
    )
    return chunks, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def assert_aborted_and_metered_once(gw: LiveGateway, request_id: str, max_tokens: int) -> None:
    """Waits up to 20 s for the usage record of a stream its client left; checks it is the
    only one, an abort on disconnect billed 1 to `max_tokens` - 1 tokens, that no second
    one follows, and that the engine runs nothing any more."""
    deadline = time.monotonic() + 20
    recs = gw.records(request_id)
    while not recs and time.monotonic() < deadline:
        time.sleep(0.05)
        recs = gw.records(request_id)
    assert len(recs) == 1
    assert recs[0].client_disconnected and recs[0].finish_reason == "abort"
    assert 1 <= recs[0].completion_tokens < max_tokens
    time.sleep(0.2)
    assert len(gw.records(request_id)) == 1
    assert gw.engine.stats().num_running == 0


@dataclass(frozen=True)
class ThreadServer:
    """uvicorn serving an app in a daemon thread: its URL, its stop, and its event loop
    (what the server's own tasks, a drain among them, must run on)."""

    url: str
    stop: Callable[[], None]
    loop: asyncio.AbstractEventLoop


def start_in_thread(
    app: Any, start_timeout_s: float = 30.0, stop_timeout_s: float = 30.0
) -> ThreadServer:
    """uvicorn on a free loopback port in a daemon thread, started within
    `start_timeout_s`; its stop waits up to `stop_timeout_s` for the thread."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=None, lifespan="on", ws=UVICORN_WS
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=stop_timeout_s)

    return ThreadServer(f"http://127.0.0.1:{port}", stop, server.servers[0].get_loop())


def serve_in_thread(
    app: Any, start_timeout_s: float = 30.0, stop_timeout_s: float = 30.0
) -> tuple[str, Callable[[], None]]:
    """uvicorn on a free loopback port in a daemon thread; returns its URL and stop."""
    started = start_in_thread(app, start_timeout_s, stop_timeout_s)
    return started.url, started.stop


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
    started = start_in_thread(app, start_timeout_s=60)

    def stop() -> None:
        started.stop()
        logging.getLogger().removeHandler(handler)

    gw = LiveGateway(started.url, "tiny", engine, sessions, usage, logs, app=app)
    return gw, stop


@contextmanager
def running(started: tuple[LiveGateway, Callable[[], None]]) -> Iterator[LiveGateway]:
    """The gateway of a `(gateway, stop)` pair, stopped when the block ends."""
    gw, stop = started
    try:
        yield gw
    finally:
        stop()


@contextmanager
def started_gateway(tmp_path: Path, engine: Any = None, **settings: Any) -> Iterator[LiveGateway]:
    """A live gateway over `engine` (by default `make_test_engine(tmp_path)`) with an
    in-memory limiter, stopped when the block ends; `settings` go to `start_gateway`."""
    if engine is None:
        engine = make_test_engine(tmp_path)
    with running(start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter(), **settings)) as gw:
        yield gw
