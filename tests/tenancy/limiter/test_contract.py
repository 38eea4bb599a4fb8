"""The Limiter contract, run against both implementations with an explicit clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

from tenancy.errors import InvalidValueError, RateLimitedError
from tenancy.limiter.base import Limiter, period_bounds
from tenancy.limiter.memory import MemoryLimiter
from tenancy.limiter.redis_limiter import RedisLimiter
from tests.utils.principals import make_principal

T0 = 1_800_000_000.0  # a fixed wall clock, mid-month
Scenario = Callable[[Limiter], Awaitable[None]]
RunOn = Callable[[Scenario], None]


@pytest.fixture(params=["memory", "redis"])
def run_on(request: pytest.FixtureRequest) -> RunOn:
    """Runs a scenario on the in-memory and on the Redis limiter, each in its own loop.

    The Redis client is made inside the loop: a `redis.asyncio` client binds to the
    loop it first runs on.
    """
    redis_at = request.getfixturevalue("redis_prefix") if request.param == "redis" else None

    def make() -> Limiter:
        if redis_at is None:
            return MemoryLimiter(lease_ttl_s=30.0)
        url, prefix = redis_at
        client = redis.asyncio.Redis.from_url(url)
        return RedisLimiter(client, fail_mode="closed", key_prefix=prefix, lease_ttl_s=30.0)

    def run(scenario: Scenario) -> None:
        async def main() -> None:
            limiter = make()
            try:
                await scenario(limiter)
            finally:
                await limiter.aclose()

        asyncio.run(main())

    return run


def test_rpm_five_then_sixth_denied_with_retry_after(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(rpm=5)
        for i in range(5):
            adm = await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)
            assert adm.requests is not None and adm.requests.remaining == 4 - i
            assert adm.requests.limit == 5
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)
        assert err.value.reason == "requests"
        # One request refills every 60/5 = 12 seconds.
        assert err.value.retry_after_s == pytest.approx(12.0)
        assert err.value.requests is not None and err.value.requests.remaining == 0
        # Just before the retry time still denied, at it admitted.
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 11.9)
        await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 12.0)

    run_on(scenario)


def test_tpm_reserves_prompt_plus_max_and_settles_to_actual(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(tpm=100)
        adm = await limiter.acquire(p, prompt_tokens=30, max_tokens=50, now=T0)
        assert adm.reserved_tokens == 80
        assert adm.tokens is not None and adm.tokens.remaining == 20
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=10, max_tokens=20, now=T0)
        assert err.value.reason == "tokens"
        assert err.value.retry_after_s == pytest.approx(6.0)  # 10 tokens at 100/min
        await limiter.release(adm, actual_tokens=40, now=T0)  # refunds 40
        adm2 = await limiter.acquire(p, prompt_tokens=10, max_tokens=50, now=T0)
        assert adm2.tokens is not None and adm2.tokens.remaining == 0
        # Release is idempotent: a second release refunds nothing more.
        await limiter.release(adm, actual_tokens=0, now=T0)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=0, now=T0)

    run_on(scenario)


def test_denial_consumes_nothing(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(rpm=10, tpm=100)
        await limiter.acquire(p, prompt_tokens=90, max_tokens=0, now=T0)
        for _ in range(3):
            with pytest.raises(RateLimitedError):
                await limiter.acquire(p, prompt_tokens=50, max_tokens=0, now=T0)
        adm = await limiter.acquire(p, prompt_tokens=10, max_tokens=0, now=T0)
        assert adm.requests is not None and adm.requests.remaining == 8

    run_on(scenario)


def test_budget_stops_at_the_budget(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(token_budget=100, budget_period="day")
        a = await limiter.acquire(p, prompt_tokens=20, max_tokens=40, now=T0)
        assert a.budget_remaining == 40
        await limiter.release(a, actual_tokens=50, now=T0)  # 50 used
        b = await limiter.acquire(p, prompt_tokens=10, max_tokens=40, now=T0)
        assert b.budget_remaining == 0
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=1, max_tokens=0, now=T0 + 1)
        assert err.value.reason == "budget"
        _, day_end = period_bounds("day", T0 + 1)
        assert err.value.retry_after_s == pytest.approx(day_end - (T0 + 1))
        await limiter.release(b, actual_tokens=50, now=T0 + 2)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=0, now=T0 + 3)
        # A new day starts a new budget.
        await limiter.acquire(p, prompt_tokens=100, max_tokens=0, now=day_end + 1)

    run_on(scenario)


def test_concurrency_two_third_denied_then_freed_by_release_and_ttl(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(max_concurrent=2)
        a = await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)
        await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)
        assert err.value.reason == "concurrency" and err.value.retry_after_s > 0
        await limiter.release(a, actual_tokens=2, now=T0 + 1)
        await limiter.release(a, actual_tokens=2, now=T0 + 1)  # idempotent: frees one slot only
        c = await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 1)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 2)
        # Leases expire after the TTL (30 s here): a crashed holder frees its slot.
        await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 30.5)
        await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 31.5)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 31.5)
        # Releasing an expired lease is a harmless no-op.
        await limiter.release(c, actual_tokens=1, now=T0 + 32)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0 + 32)

    run_on(scenario)


def test_tokens_in_flight_held_until_release_exactly_once(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(max_tokens_in_flight=100, rpm=50)
        a = await limiter.acquire(p, prompt_tokens=30, max_tokens=20, now=T0)  # holds 50
        await limiter.acquire(p, prompt_tokens=10, max_tokens=30, now=T0)  # 90 in flight
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=5, max_tokens=10, now=T0)  # 105 > 100
        assert err.value.reason == "tokens_in_flight" and err.value.retry_after_s > 0
        assert err.value.requests is not None and err.value.requests.remaining == 48
        # Exactly 10 more fit: the refusal consumed nothing.
        c = await limiter.acquire(p, prompt_tokens=4, max_tokens=6, now=T0)
        await limiter.release(c, actual_tokens=0, now=T0)
        # A release frees the whole reservation, whatever was used, and only once.
        await limiter.release(a, actual_tokens=3, now=T0 + 1)
        await limiter.release(a, actual_tokens=3, now=T0 + 1)
        await limiter.acquire(p, prompt_tokens=50, max_tokens=10, now=T0 + 1)  # 40 + 60
        with pytest.raises(RateLimitedError) as again:
            await limiter.acquire(p, prompt_tokens=1, max_tokens=0, now=T0 + 1)
        assert again.value.reason == "tokens_in_flight"
        # A crashed holder's tokens come back when its lease expires (30 s here).
        await limiter.acquire(p, prompt_tokens=60, max_tokens=40, now=T0 + 31.5)

    run_on(scenario)


def test_a_request_over_the_in_flight_cap_alone_never_passes(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal(max_tokens_in_flight=100)
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=60, max_tokens=41, now=T0)
        assert err.value.reason == "tokens_in_flight"
        adm = await limiter.acquire(p, prompt_tokens=60, max_tokens=40, now=T0)
        assert adm.reserved_tokens == 100
        # Another tenant, and a key with its own override, hold their own tokens.
        await limiter.acquire(
            make_principal("ten_b", "key_b", max_tokens_in_flight=100),
            prompt_tokens=100,
            max_tokens=0,
            now=T0,
        )
        own = make_principal(
            "ten_a",
            "key_own",
            max_tokens_in_flight=10,
            key_scoped=frozenset({"max_tokens_in_flight"}),
        )
        await limiter.acquire(own, prompt_tokens=10, max_tokens=0, now=T0)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(own, prompt_tokens=1, max_tokens=0, now=T0)

    run_on(scenario)


def test_tenants_and_key_overrides_count_separately(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        a = make_principal("ten_a", "key_1", rpm=1)
        b = make_principal("ten_b", "key_2", rpm=1)
        await limiter.acquire(a, prompt_tokens=0, max_tokens=0, now=T0)
        await limiter.acquire(b, prompt_tokens=0, max_tokens=0, now=T0)
        # Two keys of one tenant share the tenant-wide bucket...
        with pytest.raises(RateLimitedError):
            await limiter.acquire(
                make_principal("ten_a", "key_3", rpm=1), prompt_tokens=0, max_tokens=0, now=T0
            )
        # ...unless a key has its own override, counted per key.
        own = make_principal("ten_a", "key_4", rpm=1, key_scoped=frozenset({"rpm"}))
        await limiter.acquire(own, prompt_tokens=0, max_tokens=0, now=T0)

    run_on(scenario)


def test_unlimited_principal_always_admitted(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        p = make_principal()
        for _ in range(50):
            adm = await limiter.acquire(p, prompt_tokens=1000, max_tokens=1000, now=T0)
            assert adm.requests is None and adm.tokens is None and adm.budget_remaining is None

    run_on(scenario)


def test_negative_token_counts_rejected(run_on: RunOn) -> None:
    async def scenario(limiter: Limiter) -> None:
        with pytest.raises(InvalidValueError):
            await limiter.acquire(make_principal(), prompt_tokens=-1, max_tokens=0, now=T0)

    run_on(scenario)
