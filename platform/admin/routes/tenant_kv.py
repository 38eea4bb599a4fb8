"""GET /tenants/{name}/kv: the tenant's KV blocks in use and preemptions, per served model.

The figures come from the engines' own per-tenant counters (engine.stats.TenantKVStats,
keyed by the gateway's fairness key "t:<tenant id>") as the gateway last read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fastapi import APIRouter

from admin.deps import PathTenant, allow
from admin.roles import TENANT_READ
from admin.routes.engines import Replicas
from admin.schemas.tenant_kv import TenantKVModel, TenantKVView
from tenancy.scopes import tenant_scope

if TYPE_CHECKING:  # the admin service also runs without a gateway in its process
    from engine_hop.replicas import ReplicaState

router = APIRouter(prefix="/tenants", tags=["tenants"])


def _model_use(model: str, states: Sequence[ReplicaState], key: str) -> TenantKVModel:
    live = [s.snapshot for s in states if s.alive]
    num_blocks = sum(s.num_blocks for s in live)
    mine = [u for u in (s.tenant_kv.get(key) for s in live) if u is not None]
    in_use = sum(u.blocks_in_use for u in mine)
    return TenantKVModel(
        model=model,
        replicas=len(live),
        num_blocks=num_blocks,
        block_size=max((s.block_size for s in live), default=0),
        blocks_in_use=in_use,
        share_of_pool=in_use / num_blocks if num_blocks else None,
        preemptions_suffered=sum(u.preemptions_suffered for u in mine),
        preemptions_caused=sum(u.preemptions_caused for u in mine),
    )


@router.get("/{name}/kv", dependencies=[allow(TENANT_READ)])
def get_tenant_kv(tenant: PathTenant, replicas: Replicas) -> TenantKVView:
    """The tenant's KV blocks in use (against each model's pool and its own quota) and the
    preemptions its sequences suffered and caused; a tenant-admin reads only its own."""
    states = {} if replicas is None else replicas()
    key = tenant_scope(tenant.id)  # the fairness key the gateway gives the tenant
    return TenantKVView(
        tenant=tenant.name,
        kv_quota_blocks=tenant.kv_quota_blocks,
        connected=replicas is not None,
        models=[_model_use(model, s, key) for model, s in states.items()],
    )
