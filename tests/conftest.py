"""What every test gets: the logging setup it found, back after it.

`configure_logging` (what `cloister serve` calls once) sets the root logger's level and
handler and quiets some libraries' loggers. A test that calls it, or serves in this
process, would otherwise leave those for whichever test runs next in the same worker,
and a test that counts log records would see another's levels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from server.logging_setup import QUIET_LOGGERS

# Loggers `configure_logging` changes besides the root one.
_TOUCHED = (*QUIET_LOGGERS, "uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    touched = {name: logging.getLogger(name) for name in _TOUCHED}
    saved = {name: (lg.level, list(lg.handlers), lg.propagate) for name, lg in touched.items()}
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    for name, (lg_level, lg_handlers, propagate) in saved.items():
        logger = touched[name]
        logger.setLevel(lg_level)
        logger.handlers[:] = lg_handlers
        logger.propagate = propagate
