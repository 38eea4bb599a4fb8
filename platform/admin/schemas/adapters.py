"""LoRA adapters: register (already on disk), status update, and the public view."""

from __future__ import annotations

from pydantic import BaseModel, RootModel

from admin.schemas.common import IsoTime


class AdapterCreate(BaseModel):
    """A LoRA adapter already on disk in PEFT format."""

    name: str
    base_model: str
    rank: int
    source_path: str
    owner_tenant: str | None = None


class StatusUpdate(BaseModel):
    """A status change."""

    status: str


class AdapterPublic(BaseModel):
    """A LoRA adapter; `owner_tenant_id` None means public."""

    id: str
    name: str
    base_model: str
    owner_tenant_id: str | None
    rank: int
    source_path: str
    status: str
    created_at: IsoTime | None


class AdapterRuntime(BaseModel):
    """An adapter as the serving engines see it."""

    # "device": in the engine's adapter slots; "host": loaded, swapped out to host
    # memory; "disk": loaded, its weights read again from its folder when next used;
    # "loaded": loaded where the engine does not say; "not_loaded".
    state: str
    requests: int  # finished requests that selected it since the server started


class AdapterRuntimeMap(RootModel[dict[str, AdapterRuntime]]):
    """Adapter name -> its state on the engines (a plain JSON object)."""
