"""Effective limits: per-key overrides merged over the tenant's limits."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from tenancy.scopes import key_scope, tenant_scope

BudgetPeriod = Literal["day", "month"]

# Fields whose counters are kept per scope (tenant-wide or per key); see `scope_of`.
COUNTED_FIELDS: tuple[str, ...] = (
    "rpm",
    "tpm",
    "max_concurrent",
    "token_budget",
    "max_tokens_in_flight",
)


@dataclass(frozen=True)
class EffectiveLimits:
    """The limits in force for one key. None means unlimited.

    `key_scoped` names the counted fields whose value came from a per-key override:
    those are counted per key; the others are counted for the whole tenant, shared
    by all its keys.
    """

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: BudgetPeriod = "month"
    max_output_tokens: int | None = None
    max_prompt_tokens: int | None = None
    allowed_models: frozenset[str] | None = None
    # Prompt + max output tokens (times n) of the admitted, unfinished requests.
    max_tokens_in_flight: int | None = None
    key_scoped: frozenset[str] = frozenset()

    def scope_of(self, field: str, tenant_id: str, key_id: str) -> str:
        """The counter scope for `field`: "t:<tenant>" or "t:<tenant>/k:<key>"."""
        if field in self.key_scoped:
            return key_scope(tenant_id, key_id)
        return tenant_scope(tenant_id)


@dataclass(frozen=True)
class LimitValues:
    """One limits row as plain values (None = inherit from the tenant, or unlimited)."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: BudgetPeriod | None = None
    max_output_tokens: int | None = None
    max_prompt_tokens: int | None = None
    allowed_models: frozenset[str] | None = None
    max_tokens_in_flight: int | None = None


def merge_limits(tenant: LimitValues | None, key: LimitValues | None) -> EffectiveLimits:
    """Per-key values override the tenant's field by field; unset fields inherit."""
    base = tenant or LimitValues()
    over = key or LimitValues()
    values: dict[str, object] = {}
    scoped: set[str] = set()
    for f in fields(LimitValues):
        own = getattr(over, f.name)
        if own is not None:
            values[f.name] = own
            if f.name in COUNTED_FIELDS:
                scoped.add(f.name)
        else:
            values[f.name] = getattr(base, f.name)
    # A budget override without its own period keeps the tenant's period.
    if values["budget_period"] is None:
        values["budget_period"] = "month"
    return EffectiveLimits(**values, key_scoped=frozenset(scoped))  # type: ignore[arg-type]
