"""Background clients for the live workloads: coroutines on an asyncio loop of their own
thread, cancelled together when the `with` block ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any


class Loads:
    """Background clients on an asyncio loop of their own thread; leaving the `with`
    cancels them, which closes their streams (the server aborts those requests)."""

    def __init__(self, factories: list[Callable[[], Coroutine[Any, Any, None]]]) -> None:
        self._factories = factories
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self.failure: BaseException | None = None

    def __enter__(self) -> Loads:
        self._thread.start()
        self._started.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the scenario
            self.failure = exc
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks = [asyncio.create_task(f()) for f in self._factories]
        self._started.set()
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
