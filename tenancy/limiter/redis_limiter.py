"""The Redis limiter: exact across any number of gateway processes.

Each operation is one Lua script (registered with redis-py's `register_script`),
so a check-and-consume can never interleave with another process's. The client is
`redis.asyncio`: a script call awaits its reply on the event loop, with no thread
hop. When Redis is unreachable (refused, timed out, or no pooled connection free in
time) the `fail_mode` decides: "closed" raises `LimiterUnavailableError` (the gateway
answers 503); "open" admits through a per-process in-memory limiter capped at
`local_cap_rpm` per tenant. Raw redis exceptions never escape.

With a `BudgetLedger`, a budget counter missing from Redis (a restart or a flush
lost it) is seeded from the usage ledger before anything is admitted against it:
the script reports it missing, the ledger's sum is read off the loop and written
with SET NX (a replica that seeded it first wins), and the script runs again.

A `redis.asyncio` client binds to the event loop it first runs on: use one limiter
from one loop only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis
import redis.asyncio

from tenancy.errors import LimiterUnavailableError, RateInfo, RateLimitedError
from tenancy.limiter.base import DEFAULT_LEASE_TTL_S, Admission, BudgetLedger, FailMode
from tenancy.limiter.lua import ACQUIRE, RELEASE
from tenancy.limiter.memory import CONCURRENCY_RETRY_S, MemoryLimiter
from tenancy.limiter.plan import AcquirePlan, period_spend, plan_acquire
from tenancy.limits import EffectiveLimits
from tenancy.principal import Principal
from tenancy.unique_ids import UniqueIds

logger = logging.getLogger("cloister.limiter")
# What a Redis call may raise for an unreachable backend. redis-py wraps socket
# errors in its own types; OSError is a belt for any that slip through unwrapped.
BACKEND_ERRORS = (redis.RedisError, OSError)


def _num(limit: int | None) -> int:
    return -1 if limit is None else limit


def _info(limit: int | None, level: float) -> RateInfo | None:
    if limit is None:
        return None
    return RateInfo(
        limit=limit,
        remaining=max(0, math.floor(level)),
        reset_s=max(0.0, (limit - level) * 60.0 / max(limit, 1)),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLimiter:
    """A `Limiter` whose counters live in Redis; see the module docstring."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        fail_mode: FailMode = "open",
        local_cap_rpm: int = 600,
        key_prefix: str = "cloister:lim:",
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        on_backend_error: Callable[[Exception], None] | None = None,
        ledger: BudgetLedger | None = None,
    ) -> None:
        self._client = client
        self._ledger = ledger
        self._fail_mode = fail_mode
        self._local_cap_rpm = local_cap_rpm
        self._prefix = key_prefix
        self._lease_ttl_s = lease_ttl_s
        self._on_backend_error = on_backend_error
        self._acquire_script = client.register_script(ACQUIRE)
        self._release_script = client.register_script(RELEASE)
        self._local = MemoryLimiter(lease_ttl_s=lease_ttl_s)
        self._lease_ids = UniqueIds()  # unique across gateways: a random prefix each
        # Redis calls that failed; the gateway exports it. Only the loop updates it.
        self.backend_errors: int = 0

    def _key(self, tenant_id: str, kind: str, scope: str) -> str:
        # The {tenant} hash tag keeps one call's keys in one Redis Cluster slot.
        return f"{self._prefix}{{{tenant_id}}}:{kind}:{scope}"

    def _backend_failed(self, exc: Exception) -> None:
        self.backend_errors += 1
        if self._on_backend_error is not None:
            self._on_backend_error(exc)

    async def acquire(
        self, principal: Principal, *, prompt_tokens: int, max_tokens: int, now: float | None = None
    ) -> Admission:
        """See `Limiter.acquire`; may raise `LimiterUnavailableError` in fail-closed mode."""
        t = time.time() if now is None else now
        p = plan_acquire(principal, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=t)
        lease_id = self._lease_ids.next()
        seed = self._ledger is not None and p.token_budget is not None
        try:
            result = await self._run_acquire(p, lease_id, t, seed=seed)
            if _text(result[1]) == "seed":
                await self._seed(p)
                result = await self._run_acquire(p, lease_id, t, seed=False)
        except BACKEND_ERRORS as exc:
            self._backend_failed(exc)
            return await self._fallback_acquire(principal, prompt_tokens, max_tokens, t)
        ok, reason, retry, rq, tk, used = (_text(v) for v in result)
        rq_info, tk_info = _info(p.rpm, float(rq)), _info(p.tpm, float(tk))
        if ok != "1":
            raise RateLimitedError(reason, float(retry), requests=rq_info, tokens=tk_info)  # type: ignore[arg-type]
        return p.admission(
            lease_id,
            requests=rq_info,
            tokens=tk_info,
            used_after=int(float(used)),
            backend="redis",
            charged_scopes_only=False,
        )

    async def _run_acquire(self, p: AcquirePlan, lease_id: str, now: float, *, seed: bool) -> Any:
        return await self._acquire_script(
            keys=self._acquire_keys(p, lease_id),
            args=[
                repr(now),
                _num(p.rpm),
                _num(p.tpm),
                p.cost,
                _num(p.max_concurrent),
                _num(p.token_budget),
                p.budget_end,
                repr(self._lease_ttl_s),
                lease_id,
                repr(CONCURRENCY_RETRY_S),
                "1" if seed else "0",
                _num(p.max_tokens_in_flight),
            ],
        )

    async def _seed(self, p: AcquirePlan) -> None:
        """Writes the ledger's spend for the period into the missing budget counter."""
        assert self._ledger is not None
        used = await period_spend(self._ledger, p)
        key = self._key(p.tenant_id, "bd", f"{p.budget_scope}:{p.budget_start}")
        # The acquire script's expiry for the counter: a day past the period's end.
        await self._client.set(key, str(used), nx=True, exat=p.budget_end + 86400)

    def _acquire_keys(self, p: AcquirePlan, lease_id: str) -> list[str]:
        tid = p.tenant_id
        return [
            self._key(tid, "rq", p.rpm_scope),
            self._key(tid, "tk", p.tpm_scope),
            self._key(tid, "cc", p.concurrency_scope),
            self._key(tid, "bd", f"{p.budget_scope}:{p.budget_start}"),
            self._key(tid, "lease", lease_id),
            self._key(tid, "if", p.inflight_scope),
        ]

    async def _fallback_acquire(
        self, principal: Principal, prompt_tokens: int, max_tokens: int, now: float
    ) -> Admission:
        if self._fail_mode == "closed":
            raise LimiterUnavailableError("rate limiter backend unavailable") from None
        # Fail open, but never unbounded: this process caps each tenant on its own.
        # Budgets are not enforced here: the shared totals are out of reach.
        lim = principal.limits
        cap = self._local_cap_rpm if lim.rpm is None else min(lim.rpm, self._local_cap_rpm)
        local_limits = EffectiveLimits(
            rpm=cap,
            tpm=lim.tpm,
            max_concurrent=lim.max_concurrent,
            max_tokens_in_flight=lim.max_tokens_in_flight,
            budget_period=lim.budget_period,
            key_scoped=lim.key_scoped - {"token_budget"},
        )
        local = replace(principal, limits=local_limits)
        admission = await self._local.acquire(
            local, prompt_tokens=prompt_tokens, max_tokens=max_tokens, now=now
        )
        return _with_backend(admission, "local")

    async def release(
        self, admission: Admission, *, actual_tokens: int, now: float | None = None
    ) -> None:
        """See `Limiter.release`. Never raises for a backend failure: the lease TTL cleans up."""
        t = time.time() if now is None else now
        if admission.backend == "local":
            await self._local.release(admission, actual_tokens=actual_tokens, now=t)
            return
        tid = admission.tenant_id
        keys = [
            self._key(tid, "tk", admission.tpm_scope or ""),
            self._key(tid, "cc", admission.concurrency_scope or ""),
            self._key(tid, "bd", f"{admission.budget_scope}:{admission.budget_period_start}"),
            self._key(tid, "lease", admission.lease_id),
            self._key(tid, "if", admission.inflight_scope or ""),
        ]
        try:
            await self._release_script(
                keys=keys, args=[repr(t), max(0, actual_tokens), admission.lease_id]
            )
        except BACKEND_ERRORS as exc:
            # The slot frees itself when its lease expires; refunds are lost, which
            # errs on the side of the limit.
            self._backend_failed(exc)

    async def aclose(self) -> None:
        """Close the client (and its pool, when the client owns it); errors are moot now."""
        try:
            await self._client.aclose()
        except BACKEND_ERRORS as exc:
            logger.debug("closing the limiter's Redis client failed: %s", exc)


def _with_backend(admission: Admission, backend: str) -> Admission:
    return replace(admission, backend=backend)
