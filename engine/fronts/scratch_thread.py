"""Build an engine on a thread that exits afterwards, so its OpenMP team goes with it.

torch's CPU kernels run on OpenMP, and libgomp gives each thread that starts a
parallel region a team of its own, which lives as long as that thread. When a
process has more OpenMP threads than CPUs, libgomp throttles every team's
spin-wait to about a hundred spins, so between two parallel ops the workers sleep
and must be woken again. If a server loads its model on one thread and then steps
the engine on another, the loader's team stays, idle but counted, and the
engine's team pays those sleeps and wake-ups on every op. On a 2-core machine a
decode step went from 42-48 ms to 70 ms that way.

Running the build on a scratch thread that exits releases its team (libgomp frees
a thread's pool when the thread ends), so the engine thread's team is the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_on_scratch_thread(fn: Callable[[], T], *, name: str = "cloister-engine-build") -> T:
    """Runs `fn` on a new thread, waits for that thread to end, and returns `fn`'s result
    (or raises its exception)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller, whatever it was
            failure.append(exc)

    # A daemon, so that an interrupted start-up does not wait for the model to load.
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
