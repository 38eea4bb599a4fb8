"""The limiter on the event loop: inline when it is in memory, one thread hop when it is not.

`MemoryLimiter` takes a few microseconds under a lock and never blocks, so it runs
inline; a thread hop would cost more than the call. Any other limiter (Redis) does
network I/O and runs in a worker thread: one hop to acquire, and a release that is
scheduled in the background so that settling never delays the response.

Concurrency denials follow `concurrency_mode`: "reject" answers 429 at once;
"queue" waits up to `queue_timeout_s` for a slot (woken by releases in this
process, and polling for releases in other gateway processes), then answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
        self._pending: set[asyncio.Task[None]] = set()

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
        task = asyncio.ensure_future(self._release_in_thread(admission, actual_tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self) -> None:
        """Waits for background releases (at shutdown, and in tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

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

    async def _release_in_thread(self, admission: Admission, actual_tokens: int) -> None:
        try:
            await asyncio.to_thread(self.limiter.release, admission, actual_tokens=actual_tokens)
        except Exception:
            logger.exception("limiter release failed", extra={"lease": admission.lease_id})
        finally:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        # Wake everyone queued now; later waiters wait on a fresh event.
        self._released.set()
        self._released = asyncio.Event()
