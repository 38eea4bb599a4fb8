"""Ids unique across processes without a syscall per id (request ids, limiter leases).

`uuid.uuid4()` and `secrets` read os.urandom, which releases the GIL; on an event
loop that shares the GIL with the engine thread each release can cost a wait of up
to the switch interval. A random per-process prefix (drawn once) plus a counter is
as unique, and the ids need not be unguessable: none of them grants anything.
"""

from __future__ import annotations

import itertools
import secrets


class UniqueIds:
    """Hands out 24-hex ids: 12 random hex drawn per instance, then a 12-hex counter."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def next(self, kind: str | None = None) -> str:
        """A fresh id such as `5f2c9a01b7e4000000000001`, or `chatcmpl-5f2c...` with a kind."""
        value = f"{self._prefix}{next(self._counter):012x}"
        return value if kind is None else f"{kind}-{value}"
