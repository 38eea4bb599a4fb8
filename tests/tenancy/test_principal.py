"""Cache domains and limit merging."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from tenancy.authenticator import allowed_models, check_model
from tenancy.errors import PermissionDeniedError
from tenancy.limits import LimitValues, merge_limits
from tenancy.principal import derive_cache_domain
from tests.utils.principals import make_principal


def test_cache_domain_per_isolation_level() -> None:
    p = make_principal("ten_1", "key_9")
    assert derive_cache_domain(p, None) == "t:ten_1"
    assert derive_cache_domain(p, "alice") == "t:ten_1"
    k = dataclasses.replace(p, isolation_level="key")
    assert derive_cache_domain(k, "alice") == "t:ten_1/k:key_9"
    u = dataclasses.replace(p, isolation_level="user")
    digest = hashlib.sha256(b"alice").hexdigest()[:16]
    assert derive_cache_domain(u, "alice") == f"t:ten_1/u:{digest}"
    assert derive_cache_domain(u, None) == "t:ten_1"
    assert derive_cache_domain(u, "bob") != derive_cache_domain(u, "alice")


def test_user_cannot_escape_its_tenant() -> None:
    u = dataclasses.replace(make_principal("ten_1", "key_9"), isolation_level="user")
    for user in ("/../t:ten_2", "x/k:key_1", "t:ten_2"):
        assert derive_cache_domain(u, user).startswith("t:ten_1/u:")
        assert "ten_2" not in derive_cache_domain(u, user)


def test_malformed_ids_refused() -> None:
    with pytest.raises(ValueError):
        derive_cache_domain(make_principal("ten_1/k:x", "key_9"))
    with pytest.raises(ValueError):
        derive_cache_domain(
            dataclasses.replace(make_principal("ten_1", "a:b"), isolation_level="key")
        )


def test_key_overrides_merge_over_tenant_limits() -> None:
    tenant = LimitValues(rpm=60, tpm=1000, token_budget=5000, budget_period="day")
    key = LimitValues(rpm=5, max_output_tokens=64)
    merged = merge_limits(tenant, key)
    assert (merged.rpm, merged.tpm, merged.token_budget) == (5, 1000, 5000)
    assert merged.budget_period == "day" and merged.max_output_tokens == 64
    assert merged.key_scoped == frozenset({"rpm"})
    assert merged.scope_of("rpm", "t1", "k1") == "t:t1/k:k1"
    assert merged.scope_of("tpm", "t1", "k1") == "t:t1"
    assert merge_limits(None, None).rpm is None


def test_allowed_models_filter_and_check() -> None:
    p = dataclasses.replace(make_principal(), allowed_models=frozenset({"b", "c"}))
    assert allowed_models(p, ["a", "b", "c"]) == ["b", "c"]
    assert allowed_models(make_principal(), ["a", "b"]) == ["a", "b"]
    check_model(p, "b")
    with pytest.raises(PermissionDeniedError) as err:
        check_model(p, "a")
    assert err.value.model == "a"
