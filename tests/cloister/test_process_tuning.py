"""Both serving commands serve with what they loaded frozen out of the collector's walk
(server.process_tuning); `cloister serve` also with a short GIL switch interval, and the
engine server with Python's own. Both are restored when the server stops.

Without the freeze, a full collection in a process holding SmolLM2 walks about half a
million objects: about 0.3 s on a 2-core machine, a stall for every request in flight."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from server.process_tuning import (
    GIL_SWITCH_INTERVAL_S,
    loaded_objects_frozen,
    short_gil_switch_interval,
)
from tests.utils.fast_fake_model import fast_fake_front, fast_fake_settings

TOKEN = "svc-" + "process-tuning-test-token"


def _state() -> tuple[int, float]:
    return gc.get_freeze_count(), sys.getswitchinterval()


def test_each_setting_holds_while_serving_and_is_restored_after() -> None:
    before = sys.getswitchinterval()
    loaded = [{"weights": i} for i in range(100)]  # tracked objects made before serving
    with loaded_objects_frozen():
        frozen, interval = _state()
        assert frozen >= len(loaded) and interval == before
    assert _state() == (0, before)
    with short_gil_switch_interval():
        assert _state() == (0, GIL_SWITCH_INTERVAL_S)
    assert _state() == (0, before)


def test_engine_serve_serves_frozen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import uvicorn

    from cloister.commands.engine_serve import run_engine_server

    seen: list[tuple[int, float]] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: seen.append(_state()))
    settings = fast_fake_settings(tmp_path, log_level="WARNING")
    before = sys.getswitchinterval()
    run_engine_server(settings, token=TOKEN, drain_timeout_s=1.0, front=fast_fake_front(settings))
    assert len(seen) == 1
    frozen, interval = seen[0]
    # Python's own interval: the engine's thread and the event loop share the GIL, and a
    # shorter one cost the link e2e time and CPU (bench/engine_hop.py, A/B).
    assert frozen > 0 and interval == before
    assert _state() == (0, before)


def test_serve_serves_frozen_with_a_short_switch_interval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn

    from cloister.commands.serve import run_server

    seen: list[tuple[int, float]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: seen.append(_state()))
    settings = fast_fake_settings(tmp_path, log_level="WARNING")
    before = sys.getswitchinterval()
    run_server(settings, engine=fast_fake_front(settings))
    assert len(seen) == 1
    frozen, interval = seen[0]
    assert frozen > 0 and interval == GIL_SWITCH_INTERVAL_S
    assert _state() == (0, before)
