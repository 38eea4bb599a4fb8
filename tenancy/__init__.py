"""Tenants, API keys, limits, limiters and cache domains.

Public entry points (import from the submodules):
    tenancy.db            make_engine, make_session_factory, upgrade_database
    tenancy.authenticator Authenticator, allowed_models, check_model
    tenancy.principal     Principal, derive_cache_domain
    tenancy.limits        EffectiveLimits
    tenancy.limiter       Limiter, Admission, make_limiter
    tenancy.errors        AuthenticationError, PermissionDeniedError, RateLimitedError, ...
    tenancy.store         create_tenant, set_limits, create_key, revoke_key, ...
"""
