"""The limiter on the event loop: acquires awaited inline, releases settled in the background.

Both limiters are coroutines on the loop (the Redis one awaits `redis.asyncio`),
so nothing here hops to a thread: a thread hop costs more CPU than the in-memory
limiter's whole call, and extra threads fight the loop and the engine for the GIL.
`release` must never block or raise, so it starts one task per release; the tasks
are kept until they finish (the loop holds only weak references to tasks), and
`drain` awaits them.

Concurrency and tokens-in-flight denials follow `concurrency_mode`: "reject"
answers 429 at once; "queue" waits up to `queue_timeout_s` for a slot or for tokens
to come back (woken when a release in this process completes, and polling for
releases in other gateway processes), then answers 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Literal

from tenancy.errors import RateLimitedError
from tenancy.limiter.base import Admission, Limiter
from tenancy.principal import Principal

logger = logging.getLogger("cloister.gateway")
ConcurrencyMode = Literal["reject", "queue"]
# How often a queued request re-checks when no release in this process woke it
# (a slot freed by another gateway process is only seen by polling).
QUEUE_POLL_S = 0.05
# Denials a release frees: what "queue" mode waits out.
QUEUED_REASONS = frozenset({"concurrency", "tokens_in_flight"})


class AsyncLimiter:
    """The gateway's front for a `Limiter`; see the module docstring."""

    def __init__(
        self,
        limiter: Limiter,
        *,
        concurrency_mode: ConcurrencyMode = "reject",
        queue_timeout_s: float = 30.0,
    ) -> None:
        self.limiter = limiter
        self._mode = concurrency_mode
        self._queue_timeout_s = queue_timeout_s
        self._released = asyncio.Event()
        self._settling: set[asyncio.Task[None]] = set()

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
                if self._mode != "queue" or exc.reason not in QUEUED_REASONS or left <= 0:
                    raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), timeout=min(QUEUE_POLL_S, left))

    async def _acquire_once(
        self, principal: Principal, prompt_tokens: int, max_tokens: int
    ) -> Admission:
        # Shielded: a caller cancelled mid-call (client gone, shutdown) must not lose a
        # lease the backend already granted, or its slot would stay taken until the TTL.
        attempt = asyncio.ensure_future(
            self.limiter.acquire(principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        )
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            attempt.add_done_callback(self._release_orphan)
            raise

    def _release_orphan(self, attempt: asyncio.Future[Admission]) -> None:
        if not attempt.cancelled() and attempt.exception() is None:
            self.release(attempt.result(), actual_tokens=0)  # nothing was generated

    def release(self, admission: Admission, *, actual_tokens: int) -> None:
        """Settles `admission` in a background task; never raises and never blocks the loop."""
        try:
            task = asyncio.get_running_loop().create_task(self._settle(admission, actual_tokens))
        except RuntimeError:
            # No running loop (a caller off the loop): the lease's TTL frees the slot.
            logger.error(
                "limiter release outside the event loop", extra={"lease": admission.lease_id}
            )
            return
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    @property
    def pending_releases(self) -> int:
        """Releases handed over and not settled yet (metrics, tests)."""
        return len(self._settling)

    async def drain(self) -> None:
        """Waits until every release handed over so far, and any they lead to, is settled."""
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def close(self) -> None:
        """Settles what is pending, then closes the limiter (app shutdown)."""
        await self.drain()
        await self.limiter.aclose()

    async def _settle(self, admission: Admission, actual_tokens: int) -> None:
        try:
            await self.limiter.release(admission, actual_tokens=actual_tokens)
        except Exception:
            logger.exception("limiter release failed", extra={"lease": admission.lease_id})
        finally:
            if self._mode == "queue":
                self._wake_waiters()

    def _wake_waiters(self) -> None:
        # Wake everyone queued now; later waiters wait on a fresh event.
        self._released.set()
        self._released = asyncio.Event()
