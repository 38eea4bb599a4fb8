"""A tenant's live use of the engines' KV pools, as GET /tenants/{name}/kv returns it."""

from __future__ import annotations

from pydantic import BaseModel


class TenantKVModel(BaseModel):
    """The tenant's KV use on one served model's engines (summed over its live replicas)."""

    model: str
    replicas: int  # live engines behind the model, whose figures are summed
    num_blocks: int  # their KV pools, in blocks (0: not reported)
    block_size: int  # tokens per block
    blocks_in_use: int  # held by the tenant's running sequences now
    share_of_pool: float | None  # blocks_in_use / num_blocks; None: pool size unknown
    preemptions_suffered: int  # the tenant's sequences preempted, since each engine started
    preemptions_caused: int  # others' sequences preempted to make room for the tenant's


class TenantKVView(BaseModel):
    """The tenant's KV use per served model now; `connected` is False when this admin
    service runs apart from the gateway (no engines to read)."""

    tenant: str
    kv_quota_blocks: int | None  # the tenant's cap on KV blocks held per engine; None: none
    connected: bool
    models: list[TenantKVModel]
