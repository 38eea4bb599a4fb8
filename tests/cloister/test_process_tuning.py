"""Both serving commands serve with what they loaded frozen out of the collector's walk
and a short GIL switch interval (server.process_tuning), restored when they stop.

Without the freeze, a full collection in a process holding SmolLM2 walks about half a
million objects: about 0.3 s on a 2-core machine, a stall for every request in flight."""

from __future__ import annotations

import functools
import gc
import sys
from pathlib import Path
from typing import Any

import pytest

from server.process_tuning import GIL_SWITCH_INTERVAL_S, tuned_for_serving
from server.settings import Settings
from server.wiring import load_engine, serve_engine_options
from tests.utils.fast_fake_model import fast_fake_llm_engine

TOKEN = "svc-" + "process-tuning-test-token"


def _state() -> tuple[int, float]:
    return gc.get_freeze_count(), sys.getswitchinterval()


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        model_name="fast-fake",
        attention_backend="torch",
        device="cpu",
        max_model_len=512,
        kv_cache_bytes=8 * 1024 * 1024,
        log_level="WARNING",
    )


def _fake_front(settings: Settings) -> Any:
    options = serve_engine_options(settings)
    return load_engine(settings, factory=functools.partial(fast_fake_llm_engine, **options))


def test_serving_freezes_what_was_loaded_and_restores_both_after() -> None:
    before = sys.getswitchinterval()
    loaded = [{"weights": i} for i in range(100)]  # tracked objects made before serving
    with tuned_for_serving():
        frozen, interval = _state()
        assert frozen >= len(loaded)
        assert interval == GIL_SWITCH_INTERVAL_S
    assert _state() == (0, before)


def test_engine_serve_serves_tuned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import uvicorn

    from cloister.commands.engine_serve import run_engine_server

    seen: list[tuple[int, float]] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: seen.append(_state()))
    settings = _settings(tmp_path)
    before = sys.getswitchinterval()
    run_engine_server(settings, token=TOKEN, drain_timeout_s=1.0, front=_fake_front(settings))
    assert len(seen) == 1
    frozen, interval = seen[0]
    assert frozen > 0 and interval == GIL_SWITCH_INTERVAL_S
    assert _state() == (0, before)


def test_serve_serves_tuned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import uvicorn

    from cloister.commands.serve import run_server

    seen: list[tuple[int, float]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: seen.append(_state()))
    settings = _settings(tmp_path)
    before = sys.getswitchinterval()
    run_server(settings, engine=_fake_front(settings))
    assert len(seen) == 1
    frozen, interval = seen[0]
    assert frozen > 0 and interval == GIL_SWITCH_INTERVAL_S
    assert _state() == (0, before)
