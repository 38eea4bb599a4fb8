"""What one acquire has to check: the limits of a principal resolved to counter scopes.

Both limiters build the same `AcquirePlan`, so their keys and semantics agree.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tenancy.errors import InvalidValueError, LimiterUnavailableError, RateInfo
from tenancy.limiter.base import Admission, BudgetLedger, period_bounds
from tenancy.principal import Principal

logger = logging.getLogger("cloister.limiter")


@dataclass(frozen=True)
class AcquirePlan:
    """The counters one request touches; a None limit is not checked or counted."""

    tenant_id: str
    cost: int
    rpm: int | None
    rpm_scope: str
    tpm: int | None
    tpm_scope: str
    max_concurrent: int | None
    concurrency_scope: str
    max_tokens_in_flight: int | None  # the cap on `cost` summed over unfinished requests
    inflight_scope: str
    token_budget: int | None
    budget_scope: str
    budget_key_id: str | None  # the key, when the budget is counted per key; else the tenant
    budget_start: int
    budget_end: int

    def admission(
        self,
        lease_id: str,
        *,
        requests: RateInfo | None,
        tokens: RateInfo | None,
        used_after: int,
        backend: str,
        charged_scopes_only: bool,
    ) -> Admission:
        """This plan granted as `lease_id`, its budget at `used_after` tokens once charged.

        `charged_scopes_only`: a scope whose limit is None is left out (None), for a
        limiter that settles only what it counted; else every scope is named, as the
        Redis scripts expect a key for each.
        """

        def scope(limit: int | None, name: str) -> str | None:
            return name if limit is not None or not charged_scopes_only else None

        budget = self.token_budget
        return Admission(
            lease_id=lease_id,
            tenant_id=self.tenant_id,
            reserved_tokens=self.cost,
            requests=requests,
            tokens=tokens,
            budget_remaining=budget - used_after if budget is not None else None,
            tpm_scope=scope(self.tpm, self.tpm_scope),
            budget_scope=scope(self.token_budget, self.budget_scope),
            budget_period_start=(
                self.budget_start if budget is not None or not charged_scopes_only else None
            ),
            concurrency_scope=scope(self.max_concurrent, self.concurrency_scope),
            backend=backend,
            inflight_scope=scope(self.max_tokens_in_flight, self.inflight_scope),
        )


def plan_acquire(
    principal: Principal, *, prompt_tokens: int, max_tokens: int, now: float
) -> AcquirePlan:
    """Resolve a principal's effective limits into the counters to check and consume."""
    if prompt_tokens < 0 or max_tokens < 0:
        raise InvalidValueError("token counts must be non-negative")
    lim = principal.limits
    tid, kid = principal.tenant_id, principal.key_id
    start, end = period_bounds(lim.budget_period, now)
    return AcquirePlan(
        tenant_id=tid,
        cost=prompt_tokens + max_tokens,
        rpm=lim.rpm,
        rpm_scope=lim.scope_of("rpm", tid, kid),
        tpm=lim.tpm,
        tpm_scope=lim.scope_of("tpm", tid, kid),
        max_concurrent=lim.max_concurrent,
        concurrency_scope=lim.scope_of("max_concurrent", tid, kid),
        max_tokens_in_flight=lim.max_tokens_in_flight,
        inflight_scope=lim.scope_of("max_tokens_in_flight", tid, kid),
        token_budget=lim.token_budget,
        budget_scope=f"{lim.scope_of('token_budget', tid, kid)}/{lim.budget_period}",
        budget_key_id=kid if "token_budget" in lim.key_scoped else None,
        budget_start=start,
        budget_end=end,
    )


async def period_spend(ledger: BudgetLedger, p: AcquirePlan) -> int:
    """The ledger's spend for `p`'s budget period, read off the event loop.

    Raises LimiterUnavailableError when the ledger cannot answer: admitting blind
    could spend a budget twice over, so the request is refused until it is back.
    """
    try:
        used = await asyncio.to_thread(
            ledger,
            tenant_id=p.tenant_id,
            key_id=p.budget_key_id,
            start=p.budget_start,
            end=p.budget_end,
        )
    except Exception:
        logger.warning("usage ledger unavailable; cannot check a token budget", exc_info=True)
        raise LimiterUnavailableError("the usage ledger is unavailable") from None
    return max(0, int(used))
