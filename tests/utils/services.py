"""Real PostgreSQL and Redis for tests: reach them, or skip (fail under CLOISTER_REQUIRE_SERVICES=1)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.engine import make_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def unavailable(reason: str) -> None:
    """Skip the test, or fail it when the run requires the real services."""
    if os.environ.get("CLOISTER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service unavailable: {reason}")
    pytest.skip(reason)


def redis_url() -> str:
    """The Redis the tests share (REDIS_URL), checked with a PING."""
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        unavailable(f"Redis at {url} unreachable: {exc}")
    return url


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Delete this test's keys only (never FLUSHALL: the server is shared)."""
    for key in client.scan_iter(match=prefix + "*", count=500):
        client.delete(key)


@contextmanager
def postgres_database() -> Iterator[str]:
    """A freshly created, uniquely named PostgreSQL database; dropped afterwards."""
    url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    name = f"cloister_test_{secrets.token_hex(6)}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        unavailable(f"PostgreSQL at {url} unreachable: {exc.orig}")
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def wait_http_ok(
    proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float, what: str
) -> None:
    """Blocks until GET `url` answers 200; raises with the tail of `proc`'s log when it
    exited or did not answer within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    tail = log_path.read_text(errors="replace")[-4000:]
    raise RuntimeError(f"{what} did not start in {timeout_s:g} s:\n{tail}")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if `proc` does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def cloister_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """This process's environment with each of `settings` set as CLOISTER_<NAME>."""
    env = dict(os.environ)
    for name, value in settings.items():
        env[f"CLOISTER_{name.upper()}"] = str(value)
    return env


def spawn_logged(
    command: Sequence[str], env: Mapping[str, str], log_path: Path, *, append: bool = False
) -> subprocess.Popen[bytes]:
    """Starts `command` in `env` with its stdout and stderr written to `log_path` (added to
    the end with `append`, a restart's log after the first run's)."""
    log = log_path.open("ab" if append else "wb")
    proc = subprocess.Popen(list(command), env=dict(env), stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child keeps its own descriptor
    return proc


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def private_redis_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Our own throwaway redis-server (no persistence), so a test may stop it."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server binary not installed")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=0.2).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    unavailable("private redis-server did not start")
                time.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
