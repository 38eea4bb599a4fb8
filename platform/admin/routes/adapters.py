"""LoRA adapters: list, register (on disk under the model roots), upload (zip), status."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import select

from admin import registry
from admin.adapter_upload import arch_from_source, store_adapter, validate_adapter
from admin.audit_diff import changed
from admin.body_cap import CappedJsonRoute
from admin.deps import UPLOAD_CONCURRENCY, AdminContext, Ctx, allow
from admin.errors import AdapterValidationError
from admin.models import LoraAdapter
from admin.roles import PLATFORM_READ, PLATFORM_WRITE
from admin.schemas.adapters import (
    AdapterCreate,
    AdapterPublic,
    AdapterRuntime,
    AdapterRuntimeMap,
    StatusUpdate,
)
from admin.schemas.common import Page
from admin.serialize import Limit, Offset, adapter_public, page
from admin.upload_intake import new_upload_dir, receive_to_file, remove_upload_dir
from tenancy import store
from tenancy.errors import InvalidValueError, NotFoundError

__all__ = ["UPLOAD_CONCURRENCY", "router"]
router = APIRouter(prefix="/adapters", tags=["adapters"], route_class=CappedJsonRoute)


def _owner_id(ctx: AdminContext, owner: str | None) -> str | None:
    if owner is None:
        return None
    try:
        return store.get_tenant(ctx.session, owner).id
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc


def _data_dir(ctx: AdminContext) -> Path:
    return Path(ctx.services.settings.spool_path).parent


@router.get("", dependencies=[allow(PLATFORM_READ)])
def list_adapters(
    ctx: Ctx, limit: Limit = 100, offset: Offset = 0, base_model: str | None = None
) -> Page[AdapterPublic]:
    """LoRA adapters."""
    query = select(LoraAdapter).order_by(LoraAdapter.name)
    if base_model:
        query = query.where(LoraAdapter.base_model == base_model)
    return page(ctx.session, query, limit, offset, adapter_public)


@router.get("/runtime", dependencies=[allow(PLATFORM_READ)])
def adapter_runtime(request: Request) -> AdapterRuntimeMap:
    """Each adapter's state on the engines (loaded on the device, in host memory, loaded,
    not loaded) and its requests since the server started; empty without a gateway."""
    read = getattr(request.app.state, "admin_adapter_runtime", None)
    if read is None:
        return AdapterRuntimeMap({})
    return AdapterRuntimeMap({name: AdapterRuntime(**entry) for name, entry in read().items()})


@router.post("", status_code=201, dependencies=[allow(PLATFORM_WRITE)])
def register_adapter(ctx: Ctx, body: AdapterCreate) -> AdapterPublic:
    """Registers an adapter already on disk (PEFT folder, under the model roots)."""
    resource = f"adapters/{body.name}"
    ctx.check_source(body.source_path, "adapter.register", resource)
    owner = _owner_id(ctx, body.owner_tenant)
    return ctx.write_new(
        "adapter.register",
        resource,
        lambda: registry.register_adapter(
            ctx.session,
            name=body.name,
            base_model=body.base_model,
            rank=body.rank,
            source_path=body.source_path,
            owner_tenant_id=owner,
        ),
        adapter_public,
    )


def _refused(ctx: AdminContext, name: str, exc: HTTPException, outcome: str) -> HTTPException:
    """Audits a refused upload; returns `exc` to raise."""
    ctx.audit(
        "adapter.upload", f"adapters/{name}", outcome=outcome, detail={"status": exc.status_code}
    )
    return exc


def _start_upload(ctx: AdminContext, name: str) -> None:
    # Name check and slot, in a worker thread: each may write an audit record.
    try:
        registry.check_adapter_name(name)
    except InvalidValueError as exc:
        raise _refused(ctx, name, HTTPException(400, str(exc)), "invalid") from exc
    try:
        ctx.services.upload_slots.acquire()
    except HTTPException as exc:
        raise _refused(ctx, name, exc, "busy") from exc
    finally:
        # The session would otherwise hold a pooled connection while the body streams in.
        ctx.session.close()


def _finish_upload(
    ctx: AdminContext, archive: Path, name: str, base_model: str, owner_tenant: str | None
) -> AdapterPublic:
    # Runs in a worker thread: database, inflate and disk work never touch the event loop.
    roots = ctx.services.settings.model_roots
    try:
        base = registry.get_model(ctx.session, base_model)
        workdir = archive.parent / "unpacked"
        workdir.mkdir()
        validated = validate_adapter(
            archive,
            workdir,
            base_model=base_model,
            base_aliases={base.name, base.source},
            arch=arch_from_source(base.source, roots),
            max_lora_rank=ctx.services.settings.max_lora_rank,
        )
        owner = _owner_id(ctx, owner_tenant)
    except NotFoundError as exc:
        raise _refused(ctx, name, HTTPException(404, str(exc)), "error") from exc
    except AdapterValidationError as exc:
        raise _refused(ctx, name, HTTPException(400, str(exc)), "invalid") from exc
    except HTTPException as exc:  # _owner_id's 404
        raise _refused(ctx, name, exc, "error") from exc
    conflict = HTTPException(409, f"adapter {name!r} already exists")
    if ctx.session.scalars(select(LoraAdapter.id).where(LoraAdapter.name == name)).first():
        raise _refused(ctx, name, conflict, "error")
    folder = _data_dir(ctx) / "adapters" / hashlib.sha256(name.encode()).hexdigest()[:16]
    try:
        store_adapter(validated, folder)
    except OSError as exc:  # a concurrent upload of the same name stored its files first
        raise _refused(ctx, name, conflict, "error") from exc
    return ctx.write_new(
        "adapter.upload",
        f"adapters/{name}",
        lambda: registry.register_adapter(
            ctx.session,
            name=name,
            base_model=base_model,
            rank=validated.rank,
            source_path=str(folder),
            owner_tenant_id=owner,
        ),
        adapter_public,
    )


@router.post("/upload", status_code=201, dependencies=[allow(PLATFORM_WRITE)])
async def upload_adapter(
    ctx: Ctx,
    request: Request,
    name: Annotated[str, Query()],
    base_model: Annotated[str, Query()],
    owner_tenant: str | None = None,
) -> AdapterPublic:
    """Uploads a PEFT adapter folder as a zip body; validated before it is registered.

    The body streams to a file in the data directory under the size cap; the checks
    run in a worker thread, a bounded number at a time (429 beyond).
    """
    await anyio.to_thread.run_sync(_start_upload, ctx, name)
    slots = ctx.services.upload_slots
    folder: Path | None = None
    try:
        folder = await anyio.to_thread.run_sync(new_upload_dir, _data_dir(ctx) / "uploads")
        archive = folder / "adapter.zip"
        try:
            await receive_to_file(request, archive, ctx.services.settings.adapter_upload_max_bytes)
        except HTTPException as exc:
            raise await anyio.to_thread.run_sync(_refused, ctx, name, exc, "invalid") from exc
        return await anyio.to_thread.run_sync(
            _finish_upload, ctx, archive, name, base_model, owner_tenant
        )
    finally:
        if folder is not None:
            await anyio.to_thread.run_sync(remove_upload_dir, folder)
        slots.release()


@router.patch("/{name}", dependencies=[allow(PLATFORM_WRITE)])
def update_adapter(ctx: Ctx, name: str, body: StatusUpdate) -> AdapterPublic:
    """Changes an adapter's status."""
    row = ctx.session.scalars(select(LoraAdapter).where(LoraAdapter.name == name)).first()
    before = adapter_public(row) if row is not None else None
    a = ctx.write(
        "adapter.update",
        f"adapters/{name}",
        lambda: registry.set_adapter_status(ctx.session, name=name, status=body.status),
        detail=lambda a: changed(before, adapter_public(a)) if before else {},
    )
    return adapter_public(a)
