"""GET /tenants/{name}/batches: a tenant's Batch API batches and their progress.

Read from the batches tables the gateway's runner writes, so it works whether or not
this admin service shares a process with the gateway.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from admin.deps import PathTenant, ServicesDep, allow
from admin.roles import TENANT_READ
from admin.schemas.batches import BatchProgress, TenantBatches
from gateway.batch_api.batch_store import BatchInfo, BatchStore
from server.field_copy import copy_fields

router = APIRouter(prefix="/tenants", tags=["tenants"])
_ENDED_AT = ("completed_at", "failed_at", "expired_at", "cancelled_at")


def _progress(info: BatchInfo) -> BatchProgress:
    ended = [info.times[name] for name in _ENDED_AT if info.times[name] is not None]
    return copy_fields(
        BatchProgress,
        info,
        ended_at=ended[0] if ended else None,
        completed_lines=info.counts.completed,
        failed_lines=info.counts.failed,
        prompt_tokens=info.counts.prompt_tokens,
        completion_tokens=info.counts.completion_tokens,
    )


@router.get("/{name}/batches", dependencies=[allow(TENANT_READ)])
def list_tenant_batches(
    tenant: PathTenant,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> TenantBatches:
    """The tenant's batches, newest first, with lines done and failed and their tokens; a
    tenant-admin reads only its own."""
    page, more = BatchStore(services.sessions).page(tenant.id, limit=limit, after=after)
    return TenantBatches(tenant=tenant.name, items=[_progress(b) for b in page], has_more=more)
