"""Test tenants' identities: the key pepper that the test gateways and stores hash tenant
keys with, and `Principal`s with chosen limits for limiter and cache-domain tests."""

from __future__ import annotations

from tenancy.limits import EffectiveLimits
from tenancy.principal import Principal

PEPPER = "test-pepper"


def make_principal(tenant_id: str = "ten_a", key_id: str = "key_a", **limits: object) -> Principal:
    """A principal with the given effective limits (tenant-scoped unless key_scoped says)."""
    return Principal(
        tenant_id=tenant_id,
        tenant_name=tenant_id,
        key_id=key_id,
        isolation_level="tenant",
        weight=1.0,
        limits=EffectiveLimits(**limits),  # type: ignore[arg-type]
        allowed_models=None,
    )
