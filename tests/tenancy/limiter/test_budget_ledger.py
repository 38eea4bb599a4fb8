"""A limiter that starts cold rebuilds the period's budget spend from the usage ledger
(issue 13, defect 10): a fresh process (in memory) or Redis that lost its keys."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis
import redis.asyncio
from sqlalchemy.orm import Session, sessionmaker

from admin.usage_store import UsageLedger, write_usage
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.errors import LimiterUnavailableError, RateLimitedError
from tenancy.limiter.base import BudgetLedger, Limiter
from tenancy.limiter.memory import MemoryLimiter
from tenancy.limiter.redis_limiter import RedisLimiter
from tests.utils.principals import make_principal
from tests.utils.services import delete_prefix

T0 = 1_800_000_000.0  # mid-month, mid-day (UTC)
MakeLimiter = Callable[[BudgetLedger], Limiter]


def _ledger(tmp_path: Path) -> tuple[sessionmaker[Session], UsageLedger]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    return sessions, UsageLedger(sessions)


def _spend(sessions: sessionmaker[Session], rid: str, tokens: int, **row: object) -> None:
    """One usage row of `tokens` (prompt + completion) an hour before T0."""
    when = dt.datetime.fromtimestamp(T0 - 3600, dt.UTC)
    values = {
        "request_id": rid,
        "occurred_at": when.isoformat(),
        "tenant_id": "ten_a",
        "key_id": "key_a",
        "model": "m",
        "prompt_tokens": tokens // 2,
        "cached_tokens": 0,
        "completion_tokens": tokens - tokens // 2,
        "latency_s": 0.1,
        "status": 200,
        **row,
    }
    with sessions() as s:
        write_usage(s, [values])


class CountingLedger:
    """Wraps a ledger, counting reads (and failing them on demand)."""

    def __init__(self, inner: BudgetLedger) -> None:
        self.inner = inner
        self.calls = 0
        self.down = False

    def __call__(self, *, tenant_id: str, key_id: str | None, start: int, end: int) -> int:
        self.calls += 1
        if self.down:
            raise OSError("database is down")
        return self.inner(tenant_id=tenant_id, key_id=key_id, start=start, end=end)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.services)])
def make_limiter(request: pytest.FixtureRequest) -> MakeLimiter:
    if request.param == "memory":
        return lambda ledger: MemoryLimiter(ledger=ledger)
    url, prefix = request.getfixturevalue("redis_prefix")

    def make(ledger: BudgetLedger) -> Limiter:
        client = redis.asyncio.Redis.from_url(url)
        return RedisLimiter(client, fail_mode="closed", key_prefix=prefix, ledger=ledger)

    make.url, make.prefix = url, prefix  # type: ignore[attr-defined]
    return make


def _run(
    make: MakeLimiter, ledger: BudgetLedger, scenario: Callable[[Limiter], Awaitable[None]]
) -> None:
    async def main() -> None:
        limiter = make(ledger)  # a fresh limiter: a process that just started
        try:
            await scenario(limiter)
        finally:
            await limiter.aclose()

    asyncio.run(main())


def test_a_cold_limiter_seeds_the_budget_from_the_ledger(
    make_limiter: MakeLimiter, tmp_path: Path
) -> None:
    sessions, ledger = _ledger(tmp_path)
    counting = CountingLedger(ledger)
    _spend(sessions, "r1", 150)
    _spend(sessions, "r2", 40)
    _spend(sessions, "r3", 500, occurred_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC).isoformat())
    _spend(sessions, "r4", 500, tenant_id="ten_b")
    p = make_principal(token_budget=200, budget_period="day")

    async def scenario(limiter: Limiter) -> None:
        # 190 of 200 spent today before the "restart": 20 more does not fit, 10 does.
        with pytest.raises(RateLimitedError) as err:
            await limiter.acquire(p, prompt_tokens=10, max_tokens=10, now=T0)
        assert err.value.reason == "budget"
        adm = await limiter.acquire(p, prompt_tokens=5, max_tokens=5, now=T0)
        assert adm.budget_remaining == 0
        await limiter.release(adm, actual_tokens=10, now=T0)
        with pytest.raises(RateLimitedError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=0, now=T0)

    for _ in range(2):  # and again after another restart
        _run(make_limiter, counting, scenario)
        assert 1 <= counting.calls <= 2  # read once per cold counter, not on every request
        counting.calls = 0
        url = getattr(make_limiter, "url", None)
        if url is not None:  # Redis restarted empty: the counters are gone too
            delete_prefix(redis.Redis.from_url(url), make_limiter.prefix)  # type: ignore[attr-defined]


def test_a_key_scoped_budget_counts_only_that_key(
    make_limiter: MakeLimiter, tmp_path: Path
) -> None:
    sessions, ledger = _ledger(tmp_path)
    _spend(sessions, "r1", 100, key_id="key_a")
    _spend(sessions, "r2", 100, key_id="key_b")
    from tenancy.limits import EffectiveLimits
    from tenancy.principal import Principal

    base = make_principal()
    p = Principal(
        **{
            **base.__dict__,
            "limits": EffectiveLimits(
                token_budget=150, budget_period="day", key_scoped=frozenset({"token_budget"})
            ),
        }
    )

    async def scenario(limiter: Limiter) -> None:
        adm = await limiter.acquire(p, prompt_tokens=25, max_tokens=25, now=T0)
        assert adm.budget_remaining == 0  # 100 of key_a + 50: key_b's 100 does not count

    _run(make_limiter, ledger, scenario)


def test_an_unreachable_ledger_refuses_rather_than_admits_blind(
    make_limiter: MakeLimiter, tmp_path: Path
) -> None:
    _, ledger = _ledger(tmp_path)
    counting = CountingLedger(ledger)
    counting.down = True
    p = make_principal(token_budget=200, budget_period="day")
    unlimited = make_principal(tenant_id="ten_free")

    async def scenario(limiter: Limiter) -> None:
        with pytest.raises(LimiterUnavailableError):
            await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)
        await limiter.acquire(unlimited, prompt_tokens=1, max_tokens=1, now=T0)  # no budget
        counting.down = False
        await limiter.acquire(p, prompt_tokens=1, max_tokens=1, now=T0)

    _run(make_limiter, counting, scenario)
