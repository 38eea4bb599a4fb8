"""`create_admin_router`: the admin API under /admin/api/v1, bound to its services.

The routes live in admin/routes/, one module-level router per resource; who may call
each is declared there (admin/roles.py). This router binds `services` to every
request (admin/deps.py `get_services`), so nothing is module-level state.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from admin.deps import AdminServices, bind_services, refuse_nul_characters
from admin.routes import (
    adapters,
    audit,
    auth,
    batches,
    billing,
    engines,
    keys,
    limits,
    models,
    overview,
    prefixes,
    tenant_kv,
    tenants,
    tokens,
    usage,
)

PREFIX = "/admin/api/v1"
RESOURCE_ROUTERS = (
    auth.router,
    tenants.router,
    tenant_kv.router,
    batches.router,
    limits.router,
    keys.router,
    models.router,
    adapters.router,
    prefixes.router,
    usage.router,
    billing.router,
    audit.router,
    tokens.router,
    overview.router,
    engines.router,
)


def create_admin_router(services: AdminServices) -> APIRouter:
    """Every admin API route under PREFIX, each request bound to `services`."""
    router = APIRouter(
        prefix=PREFIX, dependencies=[bind_services(services), Depends(refuse_nul_characters)]
    )
    for resource in RESOURCE_ROUTERS:
        router.include_router(resource)
    return router
