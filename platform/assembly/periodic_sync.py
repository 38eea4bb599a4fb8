"""A sync from the registry into the running engines, repeated while the app serves.

The cache-rules sync and the adapter sync both do one pass (`sync_once`) at start-up
and then one every interval, on a background task of the app's event loop, started
inside the app's lifespan so that the engines run before the first pass.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI


class PeriodicSync(abc.ABC):
    """One pass now, then one every `interval_s`, until stopped."""

    task_name = "registry-sync"

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def sync_once(self) -> Any:
        """One pass; must not raise for a failure the next pass may get past."""

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.sync_once()

    async def start(self) -> None:
        """Syncs once, then keeps syncing in a background task."""
        await self.sync_once()
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        """Stops the background task (the engines keep what the last pass gave them)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def run_while_serving(app: FastAPI, sync: PeriodicSync) -> FastAPI:
    """`app` whose lifespan runs `sync` while the app serves (inside the existing
    lifespan, so the engines are started before the first pass)."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            await sync.start()
            try:
                yield
            finally:
                await sync.stop()

    app.router.lifespan_context = lifespan
    return app
