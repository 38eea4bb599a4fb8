"""The start-up summary and the periodic engine line (issue 19, section 5)."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from assembly.app import build_app
from assembly.engine_stats_log import EngineStatsLogger, engine_line
from assembly.engines import shows_progress
from assembly.lifespan import with_server_logs
from engine_hop.client import EngineSnapshot
from server.logging_setup import configure_logging
from server.settings import Settings
from tenancy import store
from tests.utils.built_app import chat_hi, prepared_sessions
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER


def snap(**fields: Any) -> EngineSnapshot:
    """A snapshot with zeros where `fields` say nothing."""
    base: dict[str, Any] = dict(
        num_running=0,
        num_waiting=0,
        kv_cache_usage=0.0,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        num_preemptions=0,
    )
    return EngineSnapshot(**{**base, **fields})


class ScriptedEngine:
    """An engine client whose `stats()` returns the given snapshots in turn."""

    def __init__(self, *snaps: EngineSnapshot) -> None:
        self.snaps = list(snaps)
        self.alive = True
        self.max_model_len = 512

    def stats(self) -> EngineSnapshot:
        """The next snapshot (the last one again once the script ends)."""
        return self.snaps.pop(0) if len(self.snaps) > 1 else self.snaps[0]


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """The root logger's JSON lines while the test runs, DEBUG included."""
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("DEBUG", stream=stream)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)
    for name in ("alembic", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def lines_of(stream: io.StringIO, logger: str) -> list[dict[str, Any]]:
    """The parsed lines `logger` wrote."""
    parsed = [json.loads(line) for line in stream.getvalue().splitlines() if line]
    return [line for line in parsed if line["logger"] == logger]


def test_engine_line_rates_are_over_the_interval() -> None:
    before = snap(
        prefix_cache_queries=100, prefix_cache_hits=40, num_prompt_tokens=1000,
        num_generation_tokens=50,
    )  # fmt: skip
    now = snap(
        num_running=3, num_waiting=1, kv_cache_usage=0.25, prefix_cache_queries=300,
        prefix_cache_hits=140, num_prompt_tokens=3000, num_generation_tokens=250,
    )  # fmt: skip
    line = engine_line("m", now, before, 2.0)
    assert (line.running, line.waiting, line.kv_usage_pct) == (3, 1, 25.0)
    assert line.prefix_hit_pct == 50.0
    assert (line.prefill_tok_s, line.decode_tok_s) == (1000.0, 100.0)
    assert line.message() == (
        "engine m: running 3, waiting 1, KV 25.0%, prefix hits 50.0%, "
        "prefill 1000.0 tok/s, decode 100.0 tok/s"
    )
    idle = engine_line("m", before, before, 2.0)
    assert idle.idle and idle.prefix_hit_pct is None and "prefix hits -" in idle.message()
    # A counter that went down: the engine restarted, and counts from zero again.
    restarted = engine_line("m", snap(num_generation_tokens=20), before, 2.0)
    assert restarted.decode_tok_s == 10.0


def test_an_idle_engine_is_reported_once_then_at_debug(logs: io.StringIO) -> None:
    busy = snap(num_running=1, num_generation_tokens=10)
    engine = ScriptedEngine(snap(), busy, busy, busy)
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0])
    stats_log = EngineStatsLogger({"m": engine}, 1.0, clock=lambda: next(clock))  # type: ignore[dict-item]
    for _ in range(3):
        stats_log.log_once()
    engine.snaps = [snap(num_generation_tokens=10)]  # finished: nothing runs any more
    stats_log.log_once()
    stats_log.log_once()
    levels = [line["level"] for line in lines_of(logs, "cloister.engine")]
    assert levels == ["INFO", "INFO", "INFO", "INFO", "DEBUG"]
    first = lines_of(logs, "cloister.engine")[1]
    assert first["decode_tok_s"] == 10.0 and first["running"] == 1 and first["model"] == "m"


def _bare_app(engines: dict[str, Any]) -> FastAPI:
    app = FastAPI()
    app.state.cloister = SimpleNamespace(engines=engines)
    return app


@pytest.mark.parametrize("interval", [0.02, 0.0])
def test_the_lifespan_logs_the_summary_once_and_engine_lines_when_set(
    tmp_path: Path, logs: io.StringIO, interval: float
) -> None:
    settings = Settings(data_dir=tmp_path, key_pepper=PEPPER, engine_log_interval_s=interval)
    busy = snap(num_running=2, kv_cache_usage=0.5, num_blocks=64, block_size=16)
    app = _bare_app({"m": ScriptedEngine(busy)})
    with_server_logs(app, settings, engine_options={"device": "cpu", "dtype": "float32"})
    with TestClient(app):
        time.sleep(0.3)
    summary = lines_of(logs, "cloister.serve")
    assert len(summary) == 1
    assert "KV 64 blocks x 16 = 1024 tokens" in summary[0]["message"]
    engine_lines = lines_of(logs, "cloister.engine")
    if interval:
        assert len(engine_lines) >= 3
        assert engine_lines[0]["message"].startswith("engine m: running 2, waiting 0, KV 50.0%")
    else:
        assert engine_lines == []


def test_cloister_serve_app_logs_its_summary_and_engine_lines(
    tmp_path: Path, logs: io.StringIO
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        key_pepper=PEPPER,
        config_refresh_s=0.0,
        model_name="fake-model",
        engine_log_interval_s=0.05,
        port=8123,
    )
    sessions = prepared_sessions(settings)
    with sessions() as s:
        store.create_tenant(s, name="acme")
        key = store.create_key(s, tenant_name="acme", pepper=PEPPER).secret
    app = build_app(settings, engine=gateway_test_engine(num_blocks=64))  # 64 blocks of 16
    try:
        with TestClient(app) as client:
            r = chat_hi(client, key, "fake-model")
            assert r.status_code == 200
            deadline = time.monotonic() + 10
            while len(lines_of(logs, "cloister.engine")) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        app.state.metering.close()
    (summary,) = [
        line
        for line in lines_of(logs, "cloister.serve")
        if "Cloister is serving" in line["message"]
    ]
    text = summary["message"]
    for expected in (
        "fake-model",
        "http://127.0.0.1:8123/v1",
        "http://127.0.0.1:8123/admin",
        "http://127.0.0.1:8123/docs",
        "http://127.0.0.1:8123/metrics",
        "fair_lpm",
        "prefix cache hash",
    ):
        assert expected in text, expected
    assert summary["startup"]["models"][0]["kv_tokens"] == 64 * 16
    engine_lines = lines_of(logs, "cloister.engine")
    assert len(engine_lines) >= 2 and engine_lines[0]["model"] == "fake-model"
    (access,) = lines_of(logs, "cloister.access")
    assert access["tenant"] == "acme" and access["status"] == 200
    assert key not in logs.getvalue()


def test_the_load_progress_bar_is_for_terminals_only(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        """stderr in a shell."""

        def isatty(self) -> bool:
            """Always a terminal."""
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    assert shows_progress("auto") and shows_progress("console")
    assert not shows_progress("json")  # JSON logs get no bar, even on a terminal
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not shows_progress("auto") and not shows_progress("console")
