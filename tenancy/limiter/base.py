"""The limiter contract shared by the in-memory and the Redis implementation.

`acquire` checks every limit of a principal and consumes them all at once, or
nothing: requests per minute (rpm), tokens per minute (tpm, reserving
prompt + max_tokens), a concurrency slot (a lease with a TTL, so a crashed
gateway frees it), the tokens in flight (prompt + max_tokens held by the lease
until it ends, against `max_tokens_in_flight`), and the token budget of the
current day or month. `release` settles the reservation to the tokens actually
used (refunding the rest of tpm and budget) and frees the slot and the tokens in
flight; it is idempotent.

The usage ledger (the usage table) is the source of truth for budgets: a limiter
given a `BudgetLedger` that finds no counter for a tenant's (or key's) budget
period (a fresh process, or Redis that lost its keys) seeds it from the ledger's
sum for the period before it admits anything, so a restart never resets a budget.

Rates are token buckets of capacity `limit` refilled at `limit` per minute,
kept as exact floats; a request costs 1 from the rpm bucket and
prompt + max_tokens from the tpm bucket.
"""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import dataclass
from typing import Literal, Protocol

from tenancy.errors import RateInfo
from tenancy.limits import BudgetPeriod
from tenancy.principal import Principal

DEFAULT_LEASE_TTL_S = 600.0
FailMode = Literal["open", "closed"]


@dataclass(frozen=True)
class Admission:
    """A granted request: what to send back in x-ratelimit-* headers and what to settle."""

    lease_id: str
    tenant_id: str
    reserved_tokens: int
    requests: RateInfo | None  # None: no rpm limit
    tokens: RateInfo | None  # None: no tpm limit
    budget_remaining: int | None  # tokens left in the period after this reservation
    tpm_scope: str | None  # counter scopes charged, so release refunds the same ones
    budget_scope: str | None
    budget_period_start: int | None  # unix time of the budget period's start
    concurrency_scope: str | None
    backend: str = "memory"  # which limiter granted it: "memory", "redis" or "local"
    inflight_scope: str | None = None  # where its tokens in flight are held, if counted


class BudgetLedger(Protocol):
    """Tokens a tenant (or one key of it) used in [start, end), from the usage ledger.

    A blocking call (a database read): limiters run it off the event loop, once per
    cold budget counter. It raises when the ledger is unreachable.
    """

    def __call__(self, *, tenant_id: str, key_id: str | None, start: int, end: int) -> int:
        """Prompt plus completion tokens recorded for the scope in [start, end) (unix s)."""
        ...


class Limiter(Protocol):
    """Admission control for one principal at a time; see the module docstring.

    Every method is a coroutine run on the caller's event loop: an implementation
    that does I/O (Redis) awaits it there instead of blocking, and one that does
    not (in memory) simply never awaits.
    """

    async def acquire(
        self, principal: Principal, *, prompt_tokens: int, max_tokens: int, now: float | None = None
    ) -> Admission:
        """Consume every limit atomically or raise `RateLimitedError` (nothing consumed).

        May raise `LimiterUnavailableError` when a shared backend is down in fail-closed mode.
        """
        ...

    async def release(
        self, admission: Admission, *, actual_tokens: int, now: float | None = None
    ) -> None:
        """Settle to `actual_tokens` (refunding the rest) and free the slot; idempotent."""
        ...

    async def aclose(self) -> None:
        """Release what the limiter holds (connections); it is not used afterwards."""
        ...


def period_bounds(period: BudgetPeriod, now: float) -> tuple[int, int]:
    """The UTC [start, end) of the day or month containing `now`, as unix seconds."""
    t = dt.datetime.fromtimestamp(now, tz=dt.UTC)
    if period == "day":
        start = dt.datetime(t.year, t.month, t.day, tzinfo=dt.UTC)
        end = start + dt.timedelta(days=1)
    else:
        start = dt.datetime(t.year, t.month, 1, tzinfo=dt.UTC)
        days = calendar.monthrange(t.year, t.month)[1]
        end = start + dt.timedelta(days=days)
    return int(start.timestamp()), int(end.timestamp())


def bucket_retry_after(level: float, cost: float, capacity: float) -> float:
    """Seconds until a bucket of `capacity` per minute holds `cost`.

    A cost above the capacity can never pass; report a full minute so clients back off.
    """
    if cost > capacity:
        return 60.0
    return max(0.0, (cost - level) * 60.0 / capacity)
