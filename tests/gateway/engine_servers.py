"""`cloister engine serve` processes on the tiny model, and a gateway in front of them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_hop.client import EngineClient
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import LiveGateway, start_gateway
from tests.utils.live_gateway import ThreadServer as ThreadServer
from tests.utils.live_gateway import serve_in_thread as serve_in_thread
from tests.utils.live_gateway import start_in_thread as start_in_thread
from tests.utils.services import cloister_env, free_port, spawn_logged, stop_process, wait_http_ok

SERVICE_TOKEN = "svc-" + "s3cret-token-for-tests-only"
ENGINE_COMMAND = [sys.executable, "-c", "from cloister.cli import main; main()", "engine", "serve"]
START_TIMEOUT_S = 120.0


@dataclass
class EngineProcess:
    """One running engine server."""

    base_url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def logs(self) -> str:
        """Everything it logged so far."""
        return self.log_path.read_text(errors="replace")


def engine_env(model_dir: Path, *, token: str | None = SERVICE_TOKEN) -> dict[str, str]:
    """CLOISTER_* for an engine server of the tiny model."""
    values = {
        "model": model_dir,
        "model_name": "tiny",
        "attention_backend": "torch",
        "max_model_len": 512,
        "kv_cache_bytes": 8 * 1024 * 1024,
        "block_size": 16,
        "log_level": "INFO",
    }
    env = cloister_env(values)
    env.pop("CLOISTER_SERVICE_TOKEN", None)
    if token is not None:
        env["CLOISTER_SERVICE_TOKEN"] = token
    return env


def spawn_engine(
    model_dir: Path,
    log_path: Path,
    *,
    port: int | None = None,
    extra: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
) -> EngineProcess:
    """Starts an engine server on a free port (or `port`); see `wait_ready`. `env` adds to
    (or overrides) the tiny model's CLOISTER_* environment."""
    port = port or free_port()
    proc = spawn_logged(
        [*ENGINE_COMMAND, "--port", str(port), *extra],
        {**engine_env(model_dir), **(env or {})},
        log_path,
        append=True,
    )
    return EngineProcess(f"http://127.0.0.1:{port}", port, proc, log_path)


def wait_ready(engine: EngineProcess) -> None:
    """Blocks until its /health answers 200."""
    wait_http_ok(
        engine.proc, engine.base_url + "/health", engine.log_path, START_TIMEOUT_S, "engine"
    )


@contextmanager
def engine_servers(model_dir: Path, log_dir: Path, count: int) -> Iterator[list[EngineProcess]]:
    """`count` engine servers, started in parallel, stopped at the end."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = [spawn_engine(model_dir, log_dir / f"engine-{i}.log") for i in range(count)]
    try:
        for engine in started:
            wait_ready(engine)
        yield started
    finally:
        for engine in started:
            stop_process(engine.proc)


@contextmanager
def gateway_over(
    tmp_path: Path, make_client: Callable[[], EngineClient], **settings: Any
) -> Iterator[LiveGateway]:
    """A live in-thread gateway whose engine is `make_client()` (a remote client)."""
    gw, stop = start_gateway(
        tmp_path, engine=None, client=make_client(), limiter=MemoryLimiter(), **settings
    )
    try:
        yield gw
    finally:
        stop()
