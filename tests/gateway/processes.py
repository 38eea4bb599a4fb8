"""Gateways as separate `cloister serve` processes (what a replica is), for cross-process tests.

Tenants and keys are written straight into the SQLite file the processes serve
from; each process sees them within its `config_refresh_s`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from admin.identity import create_admin_token
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.principals import PEPPER
from tests.utils.services import cloister_env, free_port, spawn_logged, stop_process, wait_http_ok

START_TIMEOUT_S = 120.0  # two processes importing torch on two busy cores


@dataclass(frozen=True)
class GatewayProcess:
    """One running `cloister serve` and where its output goes."""

    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def logs(self) -> str:
        """Everything the process logged so far."""
        return self.log_path.read_text(errors="replace")


def database(data_dir: Path, url: str | None = None) -> sessionmaker[Session]:
    """Migrates the database the gateways will share (`url`, by default SQLite in
    `data_dir`); returns a session factory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    url = url or f"sqlite:///{(data_dir / 'cloister.db').resolve()}"
    upgrade_database(url)
    return make_session_factory(make_engine(url))


def create_tenant_key(sessions: sessionmaker[Session], name: str, **limits: Any) -> str:
    """A tenant with `limits` and one key; returns the secret."""
    with sessions() as s:
        store.create_tenant(s, name=name)
        if limits:
            store.set_limits(s, tenant_name=name, **limits)
        return store.create_key(s, tenant_name=name, pepper=PEPPER).secret


def tenants_a_and_b(data_dir: Path) -> tuple[str, str, str]:
    """Migrates the shared database in `data_dir` with tenants "tenant-a" and "tenant-b",
    one key each; returns their secrets and a new admin token's."""
    sessions = database(data_dir)
    key_a = create_tenant_key(sessions, "tenant-a")
    key_b = create_tenant_key(sessions, "tenant-b")
    with sessions() as s:
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
    return key_a, key_b, admin


def gateway_env(data_dir: Path, model_dir: Path, **settings: Any) -> dict[str, str]:
    """Environment for `cloister serve` on the tiny model; `settings` become CLOISTER_* vars."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "key_pepper": PEPPER,
        "model": model_dir,
        "model_name": "tiny",
        "attention_backend": "torch",
        "max_model_len": 512,
        "kv_cache_bytes": 8 * 1024 * 1024,
        "config_refresh_s": 0.5,
        "log_level": "INFO",
        **settings,
    }
    return cloister_env(values)


SERVE_COMMAND = [sys.executable, "-c", "from cloister.cli import main; main()", "serve"]


def spawn_gateway(
    data_dir: Path,
    model_dir: Path,
    log_path: Path,
    *,
    command: list[str] | None = None,
    **settings: Any,
) -> GatewayProcess:
    """Starts `cloister serve` (or `command`, configured by the same CLOISTER_* environment)
    on a free port; does not wait for it (see `wait_ready`)."""
    port = free_port()
    env = gateway_env(data_dir, model_dir, port=port, **settings)
    proc = spawn_logged(command or SERVE_COMMAND, env, log_path)
    return GatewayProcess(f"http://127.0.0.1:{port}", proc, log_path)


def wait_ready(gw: GatewayProcess, timeout_s: float = START_TIMEOUT_S) -> None:
    """Blocks until /health answers; raises with the process's log when it died or hung."""
    wait_http_ok(gw.proc, gw.base_url + "/health", gw.log_path, timeout_s, "gateway")


def stop(gw: GatewayProcess) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    stop_process(gw.proc)


@contextmanager
def running_gateway(
    data_dir: Path, model_dir: Path, log_path: Path, **settings: Any
) -> Iterator[GatewayProcess]:
    """`spawn_gateway`, ready to serve; stopped at the end, also when the test killed it."""
    gw = spawn_gateway(data_dir, model_dir, log_path, **settings)
    try:
        wait_ready(gw)
        yield gw
    finally:
        stop(gw)


@contextmanager
def gateways(
    data_dir: Path,
    model_dir: Path,
    log_dir: Path,
    configs: list[dict[str, Any]],
    *,
    command: list[str] | None = None,
) -> Iterator[list[GatewayProcess]]:
    """One gateway process per settings dict, on one database, started in parallel."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        started = []
        for i, settings in enumerate(configs):
            log_path = log_dir / f"gateway-{i}.log"
            gw = spawn_gateway(data_dir, model_dir, log_path, command=command, **settings)
            stack.callback(stop, gw)
            started.append(gw)
        for gw in started:
            wait_ready(gw)
        yield started
