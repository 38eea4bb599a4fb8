"""Tenants: create, update (status and policy), settings, and the public view."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt

from admin.schemas.common import IsoTime
from admin.schemas.overview import SpendPeriod
from tenancy import store
from tenancy.errors import InvalidValueError
from tenancy.validation import check_stream_cadence

POLICY_FIELDS = frozenset(store.TENANT_POLICY_FIELDS)


def _cadence(value: str) -> str:
    """The store's check, run while the body is parsed, so that a bad value is a 400
    whose `param` is stream_cadence (the store checks again on write)."""
    try:
        return check_stream_cadence(value)
    except InvalidValueError as exc:
        raise ValueError(str(exc)) from None


StreamCadence = Annotated[str, AfterValidator(_cadence)]


class TenantCreate(BaseModel):
    """A new tenant."""

    name: str
    isolation_level: str = "tenant"
    weight: float = 1.0
    stream_cadence: StreamCadence = "token"


class TenantPolicy(BaseModel):
    """A tenant's weight and cache policy; absent fields keep their value, null clears an
    optional one (the engine default). Values are checked by the store (400 when refused)."""

    model_config = ConfigDict(extra="forbid")

    weight: StrictFloat | StrictInt | None = None
    cache_floor_blocks: StrictInt | None = None
    cache_floor_share: StrictFloat | StrictInt | None = None
    retention_ttl_s: StrictFloat | StrictInt | None = None
    scrub_on_free: StrictBool | None = None
    never_cache: StrictBool | None = None
    kv_quota_blocks: StrictInt | None = None
    # null is refused by the store: a cadence always has a value ("token" is the default).
    stream_cadence: StreamCadence | None = None

    def changes(self) -> dict[str, float | int | bool | str | None]:
        """The policy fields the caller sent, with their values."""
        return {f: getattr(self, f) for f in sorted(self.model_fields_set & POLICY_FIELDS)}


class TenantUpdate(TenantPolicy):
    """A status change and/or policy change of a tenant."""

    status: str | None = None


class TenantSettings(TenantPolicy):
    """Isolation level, scheduling weight and cache policy; absent fields keep their
    value, null clears an optional policy field (the engine default)."""

    isolation_level: str | None = None


class TenantPublic(BaseModel):
    """A tenant as the API shows it."""

    id: str
    name: str
    status: str
    isolation_level: str
    weight: float
    cache_floor_blocks: int | None
    cache_floor_share: float | None
    retention_ttl_s: float | None
    scrub_on_free: bool | None
    never_cache: bool
    kv_quota_blocks: int | None
    stream_cadence: str
    created_at: IsoTime | None


class BudgetPublic(BaseModel):
    """A tenant's token budget and its use in the current period.

    `state` is "ok", "warning" (80 % or more used) or "over" (all of it used).
    """

    token_budget: int
    period: str
    period_start: str
    used_tokens: int
    used_share: float
    state: str


class TenantSpend(BaseModel):
    """A tenant's requests, tokens and spend today and this month (UTC), and its budget."""

    today: SpendPeriod
    month: SpendPeriod
    budget: BudgetPublic | None
