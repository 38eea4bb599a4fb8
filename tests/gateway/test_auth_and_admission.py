"""The gateway's in-memory authentication cache and its awaitable limiter front."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.admission import AsyncLimiter
from gateway.auth_cache import CachingAuthenticator
from tenancy.errors import AuthenticationError, RateLimitedError
from tenancy.limiter.base import Admission
from tenancy.limiter.memory import MemoryLimiter
from tenancy.limits import LimitValues, merge_limits
from tenancy.principal import Principal
from tests.utils.live_gateway import hold_streams, make_test_engine, start_gateway


def principal(**limits: int) -> Principal:
    """A principal of tenant t1 with `limits`."""
    return Principal(
        tenant_id="t1",
        tenant_name="acme",
        key_id="k1",
        isolation_level="tenant",
        weight=1.0,
        limits=merge_limits(LimitValues(**limits), None),  # type: ignore[arg-type]
        allowed_models=None,
    )


class CountingAuthenticator:
    """Answers from a table; counts calls and records the calling threads."""

    def __init__(self) -> None:
        self.valid: dict[str, Principal] = {"good": principal()}
        self.calls = 0
        self.threads: set[int] = set()
        self.delay_s = 0.0

    def authenticate(self, bearer: str | None) -> Principal:
        """The principal of `bearer`, or AuthenticationError("invalid")."""
        self.calls += 1
        self.threads.add(threading.get_ident())
        time.sleep(self.delay_s)
        if bearer in self.valid:
            return self.valid[bearer]
        raise AuthenticationError("invalid", "invalid API key")


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_hot_path_is_inline_and_refresh_happens_ahead_in_the_background() -> None:
    inner, clock = CountingAuthenticator(), Clock()
    auth = CachingAuthenticator(inner, refresh_s=2.0, clock=clock)

    async def scenario() -> None:
        assert await auth.authenticate("good") == inner.valid["good"]
        assert inner.calls == 1 and threading.get_ident() not in inner.threads  # off the loop
        clock.now += 0.5
        await auth.authenticate("good")
        assert inner.calls == 1  # fresh: answered from memory
        clock.now += 1.0  # past half of refresh_s: answered at once, refreshed behind
        await auth.authenticate("good")
        await auth.drain()
        assert inner.calls == 2
        inner.valid.clear()  # the key is revoked in the database
        clock.now += 2.5  # the refreshed entry is stale now: the next call reads through
        with pytest.raises(AuthenticationError) as info:
            await auth.authenticate("good")
        assert info.value.reason == "invalid" and inner.calls == 3

    asyncio.run(scenario())


def test_failures_are_cached_and_concurrent_misses_share_one_read() -> None:
    inner, clock = CountingAuthenticator(), Clock()
    inner.delay_s = 0.05
    auth = CachingAuthenticator(inner, refresh_s=2.0, clock=clock)

    async def scenario() -> None:
        results = await asyncio.gather(*(auth.authenticate("good") for _ in range(10)))
        assert all(r == inner.valid["good"] for r in results)
        assert inner.calls == 1
        for _ in range(3):
            with pytest.raises(AuthenticationError):
                await auth.authenticate("bad")
        assert inner.calls == 2

    asyncio.run(scenario())


def test_zero_refresh_reads_through_every_time() -> None:
    inner = CountingAuthenticator()
    auth = CachingAuthenticator(inner, refresh_s=0.0)

    async def scenario() -> None:
        for _ in range(3):
            await auth.authenticate("good")

    asyncio.run(scenario())
    assert inner.calls == 3


def test_cache_is_bounded() -> None:
    inner = CountingAuthenticator()
    auth = CachingAuthenticator(inner, refresh_s=60.0, max_entries=4)

    async def scenario() -> None:
        for i in range(10):
            with pytest.raises(AuthenticationError):
                await auth.authenticate(f"bad-{i}")
        assert len(auth._entries) == 4

    asyncio.run(scenario())


class RecordingLimiter(MemoryLimiter):
    """A MemoryLimiter that notes the threads it runs on, can fail releases, and notes aclose."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []
        self.fail_release = False
        self.closed = False

    async def acquire(
        self, principal: Principal, *, prompt_tokens: int, max_tokens: int, now: float | None = None
    ) -> Admission:
        """Notes the thread, then acquires."""
        self.threads.append(threading.get_ident())
        return await super().acquire(
            principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=now
        )

    async def release(
        self, admission: Admission, *, actual_tokens: int, now: float | None = None
    ) -> None:
        """Notes the thread, yields once (as a Redis reply would), then releases or fails."""
        self.threads.append(threading.get_ident())
        await asyncio.sleep(0)
        if self.fail_release:
            raise RuntimeError("backend exploded")
        await super().release(admission, actual_tokens=actual_tokens, now=now)

    async def aclose(self) -> None:
        """Notes that the front closed it."""
        self.closed = True


def test_limiter_runs_on_the_loop_and_releases_settle_in_the_background() -> None:
    async def scenario() -> None:
        limiter = RecordingLimiter()
        front = AsyncLimiter(limiter)
        # Idents, not a count: a thread an earlier test left may end meanwhile.
        threads_before = {t.ident for t in threading.enumerate()}
        admission = await front.acquire(principal(max_concurrent=1), prompt_tokens=1, max_tokens=1)
        front.release(admission, actual_tokens=2)
        # release returned before settling: the slot is still held, one release pending.
        assert front.pending_releases == 1 and limiter.open_leases() == 1
        await front.drain()
        assert front.pending_releases == 0 and limiter.open_leases() == 0
        # Both calls ran on the loop's own thread, and no thread was started for them.
        assert limiter.threads == [threading.get_ident()] * 2
        assert {t.ident for t in threading.enumerate()} <= threads_before
        assert not limiter.closed
        await front.close()
        assert limiter.closed

    asyncio.run(scenario())


class SlowLimiter(MemoryLimiter):
    """A MemoryLimiter whose acquire grants at once but answers only when `reply` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = asyncio.Event()

    async def acquire(
        self, principal: Principal, *, prompt_tokens: int, max_tokens: int, now: float | None = None
    ) -> Admission:
        """Consumes the limits, then waits (like a Redis reply still on the wire)."""
        granted = await super().acquire(
            principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=now
        )
        await self.reply.wait()
        return granted


async def _granted_unanswered(
    p: Principal, *, prompt_tokens: int, max_tokens: int
) -> tuple[SlowLimiter, AsyncLimiter, asyncio.Task[Admission]]:
    """A front over a SlowLimiter and a caller whose acquire the backend has granted but
    not yet answered."""
    limiter = SlowLimiter()
    front = AsyncLimiter(limiter)
    caller = asyncio.create_task(
        front.acquire(p, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    )
    await asyncio.sleep(0.01)
    return limiter, front, caller


async def _leave_before_the_reply(
    limiter: SlowLimiter, front: AsyncLimiter, caller: asyncio.Task[Admission]
) -> None:
    """Cancels `caller` (it must end cancelled), then lets the backend's reply arrive after
    the caller left and waits for the front to settle what it granted."""
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    limiter.reply.set()
    for _ in range(5):
        await asyncio.sleep(0)
    await front.drain()


def test_a_caller_cancelled_mid_acquire_does_not_leak_the_granted_slot() -> None:
    async def scenario() -> None:
        p = principal(max_concurrent=1)
        limiter, front, caller = await _granted_unanswered(p, prompt_tokens=1, max_tokens=1)
        assert limiter.open_leases() == 1  # granted by the backend, reply not in yet
        await _leave_before_the_reply(limiter, front, caller)
        assert limiter.open_leases() == 0
        # The slot is free again for the next request.
        admission = await front.acquire(p, prompt_tokens=1, max_tokens=1)
        assert admission.lease_id

    asyncio.run(scenario())


def test_close_settles_pending_releases_first() -> None:
    async def scenario() -> None:
        limiter = RecordingLimiter()
        front = AsyncLimiter(limiter)
        p = principal(max_concurrent=5)
        for admission in [await front.acquire(p, prompt_tokens=1, max_tokens=1) for _ in range(5)]:
            front.release(admission, actual_tokens=1)
        assert limiter.open_leases() == 5
        await front.close()
        assert limiter.open_leases() == 0 and limiter.closed

    asyncio.run(scenario())


def test_a_failed_release_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        limiter = RecordingLimiter()
        limiter.fail_release = True
        front = AsyncLimiter(limiter)
        admission = await front.acquire(principal(rpm=10), prompt_tokens=1, max_tokens=1)
        front.release(admission, actual_tokens=1)
        await front.drain()
        assert front.pending_releases == 0

    with caplog.at_level(logging.ERROR, logger="cloister.gateway"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if r.getMessage() == "limiter release failed"]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)


async def _held_and_queued(
    p: Principal, *, held: tuple[int, int], queued: tuple[int, int]
) -> tuple[AsyncLimiter, Admission, asyncio.Future[Admission]]:
    """A queue-mode front over a fresh MemoryLimiter, an admission of `held` (prompt, max)
    tokens it holds, and an acquire of `queued` tokens given 0.2 s to be admitted or wait."""
    front = AsyncLimiter(MemoryLimiter(), concurrency_mode="queue", queue_timeout_s=5.0)
    first = await front.acquire(p, prompt_tokens=held[0], max_tokens=held[1])
    waiter = asyncio.ensure_future(front.acquire(p, prompt_tokens=queued[0], max_tokens=queued[1]))
    await asyncio.sleep(0.2)
    return front, first, waiter


def test_queue_mode_waits_for_a_slot_then_times_out() -> None:
    p = principal(max_concurrent=1)

    async def scenario() -> None:
        front, held, waiter = await _held_and_queued(p, held=(1, 1), queued=(1, 1))
        assert not waiter.done()  # queued behind the held slot
        front.release(held, actual_tokens=1)
        second = await asyncio.wait_for(waiter, timeout=1.0)
        short = AsyncLimiter(front.limiter, concurrency_mode="queue", queue_timeout_s=0.2)
        started = time.monotonic()
        with pytest.raises(RateLimitedError) as info:
            await short.acquire(p, prompt_tokens=1, max_tokens=1)
        assert info.value.reason == "concurrency"
        assert time.monotonic() - started >= 0.2
        front.release(second, actual_tokens=1)

    asyncio.run(scenario())


def test_reject_mode_never_waits() -> None:
    p = principal(max_concurrent=1)

    async def scenario() -> None:
        front = AsyncLimiter(MemoryLimiter(), concurrency_mode="reject", queue_timeout_s=5.0)
        await front.acquire(p, prompt_tokens=1, max_tokens=1)
        started = time.monotonic()
        with pytest.raises(RateLimitedError):
            await front.acquire(p, prompt_tokens=1, max_tokens=1)
        assert time.monotonic() - started < 0.1

    asyncio.run(scenario())


def test_concurrency_2_queue_mode_third_stream_waits_for_a_slot(tmp_path: Path) -> None:
    gw, stop = start_gateway(
        tmp_path,
        engine=make_test_engine(tmp_path),
        limiter=MemoryLimiter(),
        concurrency_mode="queue",
        concurrency_queue_timeout_s=30.0,
    )
    try:
        key = gw.tenant("acme", max_concurrent=2)
        client = gw.client(key)
        messages = [{"role": "user", "content": "hi"}]
        streams = hold_streams(client, messages)  # both hold their slot now
        result: list[httpx.Response] = []
        third = threading.Thread(
            target=lambda: result.append(
                httpx.post(
                    gw.base_url + "/v1/chat/completions",
                    json={"model": "tiny", "messages": messages, "max_tokens": 2},
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=60,
                )
            )
        )
        third.start()
        time.sleep(0.5)
        assert not result  # waiting, not refused
        streams[0].close()  # frees one slot
        third.join(timeout=30)
        assert result and result[0].status_code == 200, result
        streams[1].close()
    finally:
        stop()


def test_revocation_reaches_a_caching_gateway_within_5_seconds(tmp_path: Path) -> None:
    from tenancy import store

    gw, stop = start_gateway(
        tmp_path, engine=make_test_engine(tmp_path), limiter=MemoryLimiter(), refresh_s=1.0
    )
    try:
        key = gw.tenant("acme")
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

        def status() -> int:
            r = httpx.post(gw.base_url + "/v1/chat/completions", json=body, headers=headers)
            return r.status_code

        assert status() == 200  # the key is cached now
        with gw.sessions() as s:
            store.revoke_key(s, key_id=gw.key_id(key))
        revoked_at = time.monotonic()
        while status() == 200:
            assert time.monotonic() - revoked_at < 5.0, "revocation not seen within 5 s"
            time.sleep(0.05)
        assert status() == 401
    finally:
        stop()


def test_a_caller_cancelled_mid_acquire_gives_its_tokens_in_flight_back() -> None:
    async def scenario() -> None:
        p = principal(max_tokens_in_flight=100)
        limiter, front, caller = await _granted_unanswered(p, prompt_tokens=40, max_tokens=60)
        assert limiter.tokens_in_flight("t:t1") == 100  # granted, reply not in yet
        await _leave_before_the_reply(limiter, front, caller)
        assert limiter.tokens_in_flight("t:t1") == 0 and limiter.open_leases() == 0
        again = await front.acquire(p, prompt_tokens=40, max_tokens=30)
        other = await front.acquire(p, prompt_tokens=10, max_tokens=20)
        front.release(again, actual_tokens=5)
        front.release(again, actual_tokens=5)  # a second release frees nothing more
        await front.drain()
        assert limiter.tokens_in_flight("t:t1") == 30
        front.release(other, actual_tokens=30)
        await front.drain()
        assert limiter.tokens_in_flight("t:t1") == 0

    asyncio.run(scenario())


def test_queue_mode_waits_for_tokens_in_flight_to_come_back() -> None:
    p = principal(max_tokens_in_flight=100)

    async def scenario() -> None:
        front, held, waiter = await _held_and_queued(p, held=(50, 30), queued=(10, 20))
        assert not waiter.done()  # 80 + 30 > 100: queued
        front.release(held, actual_tokens=60)
        second = await asyncio.wait_for(waiter, timeout=1.0)
        front.release(second, actual_tokens=1)

    asyncio.run(scenario())
