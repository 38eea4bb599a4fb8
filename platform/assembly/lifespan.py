"""What runs beside the assembled app for its life: the start-up summary and the periodic
engine line, and the closers run once it has stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from server.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI


def with_server_logs(
    app: FastAPI, settings: Settings, *, engine_options: dict[str, Any] | None = None
) -> None:
    """Once the app's engines started: logs the start-up summary (once), then an engine
    line every `settings.telemetry.engine_log_interval_s` (0: none) until the app stops."""
    import asyncio
    import logging

    from assembly.engine_stats_log import EngineStatsLogger
    from assembly.startup_summary import build_summary, log_summary

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            engines = a.state.cloister.engines
            try:
                log_summary(build_summary(settings, engines, engine_options or {}))
            except Exception:  # a summary never keeps a server from serving
                logging.getLogger("cloister.serve").exception("start-up summary failed")
            task = None
            if settings.telemetry.engine_log_interval_s > 0:
                stats_log = EngineStatsLogger(engines, settings.telemetry.engine_log_interval_s)
                task = asyncio.create_task(stats_log.run(), name="engine-stats-log")
            try:
                yield
            finally:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    app.router.lifespan_context = lifespan


def close_at_shutdown(app: FastAPI, *closers: Callable[[], None]) -> None:
    """Runs `closers` in order, off the event loop, once the app's lifespan has ended."""
    from starlette.concurrency import run_in_threadpool

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        async with inner(a):
            yield
        for close in closers:
            await run_in_threadpool(close)

    app.router.lifespan_context = lifespan
