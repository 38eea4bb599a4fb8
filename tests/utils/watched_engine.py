"""A real engine front, watched: the requests it took, the aborts it was asked for,
the requests still live in it.

`Watched(front)` stands for `front` (an `EngineFront`, e.g. an AsyncEngine):
`submit` and `abort` are the front's own, recorded; everything else is the front's. Attributes a test sets on it (a tokenizer,
a vocabulary size) are what the gateway's client reads, not the engine. Failures are
patched on it (tests/utils/engine_faults.py) after it is made, so that a refused
request is not counted as taken.
"""

from __future__ import annotations

from typing import Any

from engine.request import EngineRequest


class Watched:
    """Records what reaches `front`.

    - `domains`: the cache domain of every request the front took (not refused),
      in order; `requests` the requests themselves.
    - `aborted`: the request ids the front was asked to abort.
    - `running`: the ids of the requests the front still streams.
    """

    # The front's own unless a test sets them here (read through `__getattr__`).
    tokenizer: Any
    vocab_size: int
    max_model_len: int

    def __init__(self, front: Any) -> None:
        self.front = front
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []

    def submit(self, request: EngineRequest) -> Any:
        """The front's `submit`; the request is recorded once the front took it."""
        stream = self.front.submit(request)  # raises when the request is refused
        self.requests.append(request)
        return stream

    async def abort(self, request_id: str) -> None:
        """Records the call, then the front's `abort`."""
        self.aborted.append(request_id)
        await self.front.abort(request_id)

    @property
    def domains(self) -> list[str]:
        """The cache domains of the requests taken, in order."""
        return [r.cache_domain for r in self.requests]

    @property
    def running(self) -> set[str]:
        """The ids of the requests the front has not ended yet."""
        return set(self.front._streams)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.front, name)
