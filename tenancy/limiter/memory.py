"""The in-memory limiter: exact within one process, guarded by one lock.

Its coroutines never await: each call runs to completion in one step of the
event loop, so it costs the loop a few microseconds and never yields mid-update.
The one exception is a cold budget counter (the first request of a budget period
in this process) when a `BudgetLedger` is given: its spend so far is read from the
ledger off the loop first, so a restart does not reset the budget.
The lock only matters if two event loops (threads) share one instance.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from tenancy.errors import RateInfo, RateLimitedError
from tenancy.limiter.base import DEFAULT_LEASE_TTL_S, Admission, BudgetLedger, bucket_retry_after
from tenancy.limiter.plan import AcquirePlan, period_spend, plan_acquire
from tenancy.principal import Principal
from tenancy.unique_ids import UniqueIds

logger = logging.getLogger("cloister.limiter")
# A denied concurrency slot frees when some request ends; we cannot know when.
CONCURRENCY_RETRY_S = 1.0


@dataclass
class _Bucket:
    level: float
    updated: float


@dataclass
class _Lease:
    expires: float
    reserved: int
    tpm: int | None
    tpm_scope: str | None
    budget_key: tuple[str, int] | None
    concurrency_scope: str | None
    inflight_scope: str | None = None


def _rate_info(limit: int, level_after: float) -> RateInfo:
    return RateInfo(
        limit=limit,
        remaining=max(0, math.floor(level_after)),
        reset_s=max(0.0, (limit - level_after) * 60.0 / limit),
    )


class MemoryLimiter:
    """A `Limiter` for a single process (the default `cloister serve`)."""

    def __init__(
        self, *, lease_ttl_s: float = DEFAULT_LEASE_TTL_S, ledger: BudgetLedger | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._ledger = ledger
        self._lease_ttl_s = lease_ttl_s
        self._buckets: dict[str, _Bucket] = {}
        self._slots: dict[str, dict[str, float]] = {}  # scope -> lease id -> expiry
        self._inflight: dict[str, dict[str, int]] = {}  # scope -> lease id -> tokens held
        self._budgets: dict[str, tuple[int, int]] = {}  # scope -> (period start, used)
        self._leases: dict[str, _Lease] = {}
        self._lease_ids = UniqueIds()

    def _level(self, key: str, capacity: int, now: float) -> float:
        b = self._buckets.get(key)
        if b is None:
            return float(capacity)
        return min(float(capacity), b.level + (now - b.updated) * capacity / 60.0)

    def _used(self, scope: str, start: int) -> int:
        period, used = self._budgets.get(scope, (start, 0))
        return used if period == start else 0

    def _purge(self, now: float) -> None:
        for lease_id in [k for k, v in self._leases.items() if v.expires <= now]:
            self._drop_slot(self._leases.pop(lease_id), lease_id)

    def _drop_slot(self, lease: _Lease, lease_id: str) -> None:
        if lease.concurrency_scope is not None:
            self._slots.get(lease.concurrency_scope, {}).pop(lease_id, None)
        if lease.inflight_scope is not None:
            held = self._inflight.get(lease.inflight_scope)
            if held is not None:
                held.pop(lease_id, None)
                if not held:
                    del self._inflight[lease.inflight_scope]

    async def acquire(
        self, principal: Principal, *, prompt_tokens: int, max_tokens: int, now: float | None = None
    ) -> Admission:
        """See `Limiter.acquire`."""
        t = time.time() if now is None else now
        p = plan_acquire(principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=t)
        if self._ledger is not None and p.token_budget is not None and not self._warm(p):
            await self._seed(p, self._ledger)
        with self._lock:
            self._purge(t)
            return self._acquire_locked(p, t)

    def _warm(self, p: AcquirePlan) -> bool:
        with self._lock:
            entry = self._budgets.get(p.budget_scope)
            return entry is not None and entry[0] == p.budget_start

    async def _seed(self, p: AcquirePlan, ledger: BudgetLedger) -> None:
        """Sets a cold budget counter to the ledger's spend for the period (once)."""
        used = await period_spend(ledger, p)
        with self._lock:
            entry = self._budgets.get(p.budget_scope)
            if entry is None or entry[0] != p.budget_start:  # nobody seeded it meanwhile
                self._budgets[p.budget_scope] = (p.budget_start, used)

    def _acquire_locked(self, p: AcquirePlan, now: float) -> Admission:
        rq_level = self._level("r/" + p.rpm_scope, p.rpm, now) if p.rpm is not None else 0.0
        tk_level = self._level("t/" + p.tpm_scope, p.tpm, now) if p.tpm is not None else 0.0
        rq_info = _rate_info(p.rpm, rq_level) if p.rpm is not None else None
        tk_info = _rate_info(p.tpm, tk_level) if p.tpm is not None else None
        slots = self._slots.setdefault(p.concurrency_scope, {})
        in_flight = self._inflight.get(p.inflight_scope, {})
        used = self._used(p.budget_scope, p.budget_start)

        def deny(reason: str, retry: float) -> RateLimitedError:
            return RateLimitedError(reason, retry, requests=rq_info, tokens=tk_info)  # type: ignore[arg-type]

        if p.max_concurrent is not None and len(slots) >= p.max_concurrent:
            raise deny("concurrency", CONCURRENCY_RETRY_S)
        if p.max_tokens_in_flight is not None and (
            sum(in_flight.values()) + p.cost > p.max_tokens_in_flight
        ):
            raise deny("tokens_in_flight", CONCURRENCY_RETRY_S)
        if p.rpm is not None and rq_level < 1.0:
            raise deny("requests", bucket_retry_after(rq_level, 1.0, p.rpm))
        if p.tpm is not None and tk_level < p.cost:
            raise deny("tokens", bucket_retry_after(tk_level, p.cost, p.tpm))
        if p.token_budget is not None and used + p.cost > p.token_budget:
            raise deny("budget", max(0.0, p.budget_end - now))

        # Every check passed: consume all of them.
        if p.rpm is not None:
            self._buckets["r/" + p.rpm_scope] = _Bucket(rq_level - 1.0, now)
            rq_info = _rate_info(p.rpm, rq_level - 1.0)
        if p.tpm is not None:
            self._buckets["t/" + p.tpm_scope] = _Bucket(tk_level - p.cost, now)
            tk_info = _rate_info(p.tpm, tk_level - p.cost)
        if p.token_budget is not None:
            self._budgets[p.budget_scope] = (p.budget_start, used + p.cost)
        lease_id = self._lease_ids.next()
        expires = now + self._lease_ttl_s
        if p.max_concurrent is not None:
            slots[lease_id] = expires
        if p.max_tokens_in_flight is not None:
            self._inflight.setdefault(p.inflight_scope, {})[lease_id] = p.cost
        admission = p.admission(
            lease_id,
            requests=rq_info,
            tokens=tk_info,
            used_after=used + p.cost,
            backend="memory",
            charged_scopes_only=True,
        )
        self._leases[lease_id] = _Lease(
            expires=expires,
            reserved=p.cost,
            tpm=p.tpm,
            tpm_scope=admission.tpm_scope,
            budget_key=(p.budget_scope, p.budget_start) if p.token_budget is not None else None,
            concurrency_scope=admission.concurrency_scope,
            inflight_scope=admission.inflight_scope,
        )
        return admission

    async def release(
        self, admission: Admission, *, actual_tokens: int, now: float | None = None
    ) -> None:
        """See `Limiter.release`. A lease already released or expired is a no-op."""
        t = time.time() if now is None else now
        with self._lock:
            lease = self._leases.pop(admission.lease_id, None)
            if lease is None or lease.expires <= t:
                if lease is not None:
                    self._drop_slot(lease, admission.lease_id)
                return
            self._drop_slot(lease, admission.lease_id)
            # Positive: refund unused tokens; negative: charge the overrun.
            delta = lease.reserved - max(0, actual_tokens)
            if lease.tpm is not None and lease.tpm_scope is not None:
                key = "t/" + lease.tpm_scope
                level = self._level(key, lease.tpm, t)
                self._buckets[key] = _Bucket(min(float(lease.tpm), level + delta), t)
            if lease.budget_key is not None:
                scope, start = lease.budget_key
                used = self._used(scope, start)
                if self._budgets.get(scope, (start, 0))[0] == start:
                    self._budgets[scope] = (start, max(0, used - delta))

    async def aclose(self) -> None:
        """Nothing to release: the counters are plain memory."""

    def open_leases(self) -> int:
        """How many leases are held (for tests and debugging)."""
        with self._lock:
            return len(self._leases)

    def tokens_in_flight(self, scope: str) -> int:
        """Tokens held in flight in `scope` ("t:<tenant>"), expired leases included until
        the next acquire purges them (for tests and debugging)."""
        with self._lock:
            return sum(self._inflight.get(scope, {}).values())
