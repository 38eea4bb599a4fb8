"""Running a coroutine at once, in the caller, up to the point where it has to wait.

A WebSocket send (uvicorn's, or the websockets library's) waits only while the
transport is paused for flow control; otherwise it writes and returns without ever
suspending. Sending from a task instead costs a wake-up of the event loop per frame,
which on the link's hot path is a measurable part of each token's hop
(bench/engine_hop.py). Python 3.12's eager tasks do this; the project runs on 3.11.
Both ends of the link send their frames with it (engine_server.link, engine_hop.link_client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["start_now"]


def start_now(coro: Coroutine[Any, Any, None]) -> asyncio.Future[None] | None:
    """Runs `coro` here until it first waits: None if it finished (an exception it
    raised is raised here), else a future that finishes running it on the loop."""
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_Rest(coro, waiting_on))


class _Rest:
    """The rest of a started coroutine, as an awaitable a task can run."""

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        self._coro, self._waiting_on = coro, waiting_on

    def __await__(self) -> Generator[Any, None, None]:
        # The task waits on what the coroutine yielded (a future, or None for a bare
        # yield), then resumes the coroutine as its own task would have.
        try:
            yield self._waiting_on
        except BaseException:
            self._coro.close()
            raise
        yield from self._coro.__await__()
