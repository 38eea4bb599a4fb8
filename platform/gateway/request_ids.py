"""Request ids that are unique across gateway processes without a syscall per request.

`uuid.uuid4()` reads os.urandom, which releases the GIL; on a loop that shares the
GIL with the engine thread every such release can cost a wait of up to the switch
interval. A random per-process prefix (drawn once) plus a counter is as unique.
"""

from __future__ import annotations

import itertools
import secrets


class RequestIds:
    """Hands out `<kind>-<24 hex>` ids: 12 random hex per process, then a counter."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def next(self, kind: str) -> str:
        """A fresh id such as `chatcmpl-5f2c9a01b7e4000000000001`."""
        return f"{kind}-{self._prefix}{next(self._counter):012x}"
