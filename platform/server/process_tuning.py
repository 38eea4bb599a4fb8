"""How a serving process sets up the interpreter once its model and app are loaded
(`cloister serve`, `cloister engine serve`)."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms).
GIL_SWITCH_INTERVAL_S = 0.0005


@contextlib.contextmanager
def loaded_objects_frozen() -> Iterator[None]:
    """Moves everything loaded so far out of the collector's walk while the server runs.

    A model, its tokenizer and the app live as long as the process: frozen, a full
    collection no longer walks them (about half a million objects with SmolLM2 loaded,
    0.3 s a pass on a 2-core machine, paid by every request in flight).
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # let shutdown free them (extension modules check for leaks)


@contextlib.contextmanager
def short_gil_switch_interval() -> Iterator[None]:
    """`GIL_SWITCH_INTERVAL_S` while the server runs, then the interval it had.

    The gateway's event loop shares the GIL with the metering writer and the console's
    sampler: when it gives the GIL up for a socket call, it waits for whichever of
    them took it to give it back, by default up to 5 ms a time.
    """
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(switch_interval)
