"""Failed credentials counted per source (client address) in fixed windows.

A source that sends `limit` bad credentials within `window_s` seconds is refused
(AuthThrottledError, HTTP 429 with Retry-After) until its window ends, before any
database read. The table is bounded: under a flood from very many sources the
oldest windows are forgotten first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from tenancy.errors import AuthThrottledError

MAX_SOURCES = 50_000


class FailureThrottle:
    """Thread-safe per-source failure counter; `limit` 0 disables it."""

    def __init__(
        self,
        *,
        limit: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_sources: int = MAX_SOURCES,
    ) -> None:
        self._limit = limit
        self._window_s = window_s
        self._clock = clock
        self._max_sources = max_sources
        self._lock = threading.Lock()
        self._windows: OrderedDict[str, tuple[float, int]] = OrderedDict()  # start, failures

    def check(self, source: str | None) -> None:
        """Raises AuthThrottledError while `source` is over its limit in this window."""
        if self._limit <= 0:
            return
        now = self._clock()
        with self._lock:
            window = self._windows.get(source or "")
        if window is None:
            return
        start, failures = window
        left = start + self._window_s - now
        if failures >= self._limit and left > 0:
            raise AuthThrottledError(retry_after_s=left)

    def failed(self, source: str | None) -> None:
        """Counts one bad credential from `source`."""
        if self._limit <= 0:
            return
        now = self._clock()
        name = source or ""
        with self._lock:
            start, failures = self._windows.get(name, (now, 0))
            if now - start >= self._window_s:
                start, failures = now, 0
            self._windows[name] = (start, failures + 1)
            self._windows.move_to_end(name)
            while len(self._windows) > self._max_sources:
                self._windows.popitem(last=False)
