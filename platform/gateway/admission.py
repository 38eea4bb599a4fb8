"""The limiter on the event loop: inline when it is in memory, one thread hop when it is not.

`MemoryLimiter` takes a few microseconds under a lock and never blocks, so it runs
inline; a thread hop would cost more than the call. Any other limiter (Redis) does
network I/O and runs off the loop: one thread hop to acquire, and releases handed to
one settling thread through a queue (a put costs the loop about a microsecond, where
a thread-pool hop costs tens), so that settling never delays a response.

Concurrency denials follow `concurrency_mode`: "reject" answers 429 at once;
"queue" waits up to `queue_timeout_s` for a slot (woken by releases in this
process, and polling for releases in other gateway processes), then answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from typing import Literal

from tenancy.errors import RateLimitedError
from tenancy.limiter.base import Admission, Limiter
from tenancy.limiter.memory import MemoryLimiter
from tenancy.principal import Principal

logger = logging.getLogger("cloister.gateway")
ConcurrencyMode = Literal["reject", "queue"]
# How often a queued request re-checks when no release in this process woke it
# (a slot freed by another gateway process is only seen by polling).
QUEUE_POLL_S = 0.05


class AsyncLimiter:
    """An awaitable front for a `Limiter`; see the module docstring."""

    def __init__(
        self,
        limiter: Limiter,
        *,
        concurrency_mode: ConcurrencyMode = "reject",
        queue_timeout_s: float = 30.0,
        inline: bool | None = None,
    ) -> None:
        self.limiter = limiter
        self._inline = isinstance(limiter, MemoryLimiter) if inline is None else inline
        self._mode = concurrency_mode
        self._queue_timeout_s = queue_timeout_s
        self._released = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # (admission, actual tokens) to settle, a threading.Event to set once reached,
        # or None to end the settling thread.
        self._settle: queue.SimpleQueue[tuple[Admission, int] | threading.Event | None] = (
            queue.SimpleQueue()
        )
        self._settler: threading.Thread | None = None

    async def acquire(
        self, principal: Principal, *, prompt_tokens: int, max_tokens: int
    ) -> Admission:
        """Consumes every limit or raises `RateLimitedError` / `LimiterUnavailableError`."""
        deadline = time.monotonic() + self._queue_timeout_s
        while True:
            # Taken before the attempt, so a release landing during it is not missed.
            released = self._released
            try:
                return await self._acquire_once(principal, prompt_tokens, max_tokens)
            except RateLimitedError as exc:
                left = deadline - time.monotonic()
                if self._mode != "queue" or exc.reason != "concurrency" or left <= 0:
                    raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), timeout=min(QUEUE_POLL_S, left))

    def release(self, admission: Admission, *, actual_tokens: int) -> None:
        """Settles `admission`; never raises and never blocks the loop."""
        if self._inline:
            try:
                self.limiter.release(admission, actual_tokens=actual_tokens)
            except Exception:
                logger.exception("limiter release failed", extra={"lease": admission.lease_id})
            self._wake_waiters()
            return
        if self._settler is None:
            self._loop = asyncio.get_running_loop()
            self._settler = threading.Thread(
                target=self._settle_forever, name="cloister-limiter-release", daemon=True
            )
            self._settler.start()
        self._settle.put((admission, actual_tokens))

    async def drain(self) -> None:
        """Waits until every release handed over so far is settled (shutdown, tests)."""
        if self._settler is None:
            return
        reached = threading.Event()
        self._settle.put(reached)
        await asyncio.to_thread(reached.wait, 30.0)

    async def close(self) -> None:
        """Settles what is pending and ends the settling thread (app shutdown)."""
        await self.drain()
        if self._settler is not None:
            self._settle.put(None)
            self._settler = None

    async def _acquire_once(
        self, principal: Principal, prompt_tokens: int, max_tokens: int
    ) -> Admission:
        if self._inline:
            return self.limiter.acquire(
                principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens
            )
        return await asyncio.to_thread(
            self.limiter.acquire, principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens
        )

    def _settle_forever(self) -> None:
        # Runs in the settling thread for the life of the process (a daemon).
        while True:
            item = self._settle.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            admission, actual_tokens = item
            try:
                self.limiter.release(admission, actual_tokens=actual_tokens)
            except Exception:
                logger.exception("limiter release failed", extra={"lease": admission.lease_id})
            if self._mode == "queue" and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                    self._loop.call_soon_threadsafe(self._wake_waiters)

    def _wake_waiters(self) -> None:
        # Wake everyone queued now; later waiters wait on a fresh event.
        self._released.set()
        self._released = asyncio.Event()
