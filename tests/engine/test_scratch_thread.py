"""Building on a scratch thread: the result or the error comes back, and the thread's
OpenMP team leaves with it (a live second team throttles the engine thread's team)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from engine.fronts.scratch_thread import run_on_scratch_thread


def test_returns_the_result_from_another_thread_that_has_ended() -> None:
    seen: list[threading.Thread] = []

    def build() -> str:
        seen.append(threading.current_thread())
        return "engine"

    assert run_on_scratch_thread(build) == "engine"
    assert seen[0] is not threading.current_thread()
    assert not seen[0].is_alive()


def test_raises_the_builds_error() -> None:
    def build() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        run_on_scratch_thread(build)


# Counts this process's OS threads around a parallel torch op run one way or the other.
PROBE = textwrap.dedent(
    """
    import os, sys, time, torch
    from engine.fronts.scratch_thread import run_on_scratch_thread
    torch.set_num_threads(2)
    x = torch.randn(2048, 2048)
    def work():
        for _ in range(3):
            x @ x
    before = len(os.listdir("/proc/self/task"))
    if sys.argv[1] == "scratch":
        run_on_scratch_thread(work)
        # The team's workers are told to exit when the thread ends: give them time.
        deadline = time.monotonic() + 20
        while len(os.listdir("/proc/self/task")) > before and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        work()
    print(len(os.listdir("/proc/self/task")) - before)
    """
)


def threads_left(how: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, how], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def test_the_scratch_threads_openmp_team_does_not_outlive_it() -> None:
    kept = threads_left("here")
    assert kept >= 1  # the caller keeps its team: the probe can see one
    # Other threads a busy machine may start (none here) would show in both counts.
    assert threads_left("scratch") < kept


def test_serve_builds_its_engine_off_the_calling_thread(tmp_path: object) -> None:
    from assembly.engines import load_engine
    from server.settings import Settings

    threads: list[threading.Thread] = []

    def factory() -> object:
        threads.append(threading.current_thread())
        from tests.utils.fast_fake_model import fast_fake_llm_engine

        return fast_fake_llm_engine()

    engine = load_engine(Settings(engine_mode="thread"), factory=factory)  # type: ignore[arg-type]
    assert threads[0] is not threading.current_thread() and not threads[0].is_alive()
    assert engine.engine is not None
