"""`create_admin_router`: the admin API under /admin/api/v1 (see deps.py for who may do what)."""

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt
from sqlalchemy import select

from admin import registry
from admin.body_cap import CappedJsonRoute
from admin.deps import AdminContext, AdminServices, context_dependency
from admin.serialize import Limit, Offset, key_dict, model_dict, page, tenant_dict
from admin.source_paths import SourcePathError, check_source
from tenancy import store
from tenancy.errors import ConflictError, InvalidValueError, NotFoundError, TenancyError
from tenancy.models import ApiKey, Tenant

PREFIX = "/admin/api/v1"


class TenantCreate(BaseModel):
    """A new tenant."""

    name: str
    isolation_level: str = "tenant"
    weight: float = 1.0


class TenantPolicy(BaseModel):
    """A tenant's weight and cache policy; absent fields keep their value, null clears an
    optional one (the engine default). Values are checked by the store (422 when refused)."""

    model_config = ConfigDict(extra="forbid")

    weight: StrictFloat | StrictInt | None = None
    cache_floor_blocks: StrictInt | None = None
    cache_floor_share: StrictFloat | StrictInt | None = None
    retention_ttl_s: StrictFloat | StrictInt | None = None
    scrub_on_free: StrictBool | None = None
    never_cache: StrictBool | None = None

    def changes(self) -> dict[str, Any]:
        """The policy fields the caller sent, with their values."""
        return {f: getattr(self, f) for f in sorted(self.model_fields_set & POLICY_FIELDS)}


POLICY_FIELDS = frozenset(store.TENANT_POLICY_FIELDS)


class TenantUpdate(TenantPolicy):
    """A status change and/or policy change of a tenant."""

    status: str | None = None


class KeyCreate(BaseModel):
    """A new API key."""

    name: str | None = None
    allowed_models: list[str] | None = None
    expires_in_days: float | None = None


class ModelCreate(BaseModel):
    """A model to register; prices in micro-USD per million tokens.

    With no price at all the model is unpriced (its usage is billed $0 and marked
    unpriced) until one is set; a price given in part is 0 for the parts left out.
    `allowed_tenants` are tenant ids (None: every tenant).
    """

    name: str
    source: str
    format: str
    context_length: int
    revision: str = "main"
    input_price: int | None = None
    cached_input_price: int | None = None
    output_price: int | None = None
    allowed_tenants: list[str] | None = None

    def prices(self) -> registry.Prices | None:
        """The first price, or None for an unpriced model."""
        given = (self.input_price, self.cached_input_price, self.output_price)
        if all(p is None for p in given):
            return None
        return registry.Prices(*(p or 0 for p in given))


class ModelUpdate(BaseModel):
    """A status or allow-list (tenant ids) change."""

    status: str | None = None
    allowed_tenants: list[str] | None = None
    clear_allowed_tenants: bool = False


class PriceCreate(BaseModel):
    """A new price, effective from a time (default now)."""

    input_price: int
    cached_input_price: int
    output_price: int
    effective_from: dt.datetime | None = None


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


class PrefixCreate(BaseModel):
    """A shared prefix: token ids or text."""

    name: str
    model: str
    token_ids: list[int] | None = None
    text: str | None = None


class TokenCreate(BaseModel):
    """A new admin API token."""

    role: str
    tenant: str | None = None
    name: str | None = None


def _tenant(ctx: AdminContext, name: str) -> Tenant:
    """The named tenant, 404 for a missing one or (to a tenant-admin) another's."""
    try:
        tenant = store.get_tenant(ctx.session, name)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc
    ctx.require_tenant(tenant.id)
    return tenant


def _mapped(exc: TenancyError) -> HTTPException:
    if isinstance(exc, NotFoundError):
        return HTTPException(404, str(exc))
    if isinstance(exc, ConflictError):
        return HTTPException(409, str(exc))
    if isinstance(exc, InvalidValueError):
        return HTTPException(422, str(exc))
    return HTTPException(400, str(exc))


def create_admin_router(services: AdminServices) -> APIRouter:
    """The admin API routes, bound to `services` (no module-level state)."""
    router = APIRouter(prefix=PREFIX, tags=["admin"], route_class=CappedJsonRoute)
    Ctx = Annotated[AdminContext, Depends(context_dependency(services))]

    def write(
        ctx: AdminContext,
        action: str,
        resource: str,
        fn: Any,
        tenant_id: str | None = None,
        **detail: Any,
    ) -> Any:
        try:
            result = fn()
        except TenancyError as exc:
            ctx.session.rollback()
            ctx.audit(action, resource, outcome="error", tenant_id=tenant_id)
            raise _mapped(exc) from exc
        ctx.audit(action, resource, tenant_id=tenant_id, **detail)
        return result

    @router.get("/whoami")
    def whoami(ctx: Ctx) -> dict[str, Any]:
        """The caller's identity."""
        i = ctx.identity
        return {"actor": i.actor, "role": i.role, "tenant_id": i.tenant_id}

    @router.get("/tenants")
    def list_tenants(
        ctx: Ctx,
        limit: Limit = 100,
        offset: Offset = 0,
        status: str | None = None,
        name_contains: str | None = None,
    ) -> dict[str, Any]:
        """Tenants, paginated; a tenant-admin sees only its own."""
        query = select(Tenant).order_by(Tenant.name)
        if ctx.identity.role == "tenant-admin":
            query = query.where(Tenant.id == ctx.identity.tenant_id)
        if status:
            query = query.where(Tenant.status == status)
        if name_contains:
            query = query.where(Tenant.name.contains(name_contains))
        return page(ctx.session, query, limit, offset, tenant_dict)

    @router.post("/tenants", status_code=201)
    def create_tenant(ctx: Ctx, body: TenantCreate) -> dict[str, Any]:
        """Creates a tenant."""
        ctx.require("admin")
        t = write(
            ctx,
            "tenant.create",
            f"tenants/{body.name}",
            lambda: store.create_tenant(
                ctx.session,
                name=body.name,
                isolation_level=body.isolation_level,
                weight=body.weight,
            ),
        )
        return tenant_dict(t)

    @router.get("/tenants/{name}")
    def get_tenant(ctx: Ctx, name: str) -> dict[str, Any]:
        """One tenant."""
        return tenant_dict(_tenant(ctx, name))

    @router.patch("/tenants/{name}")
    def update_tenant(ctx: Ctx, name: str, body: TenantUpdate) -> dict[str, Any]:
        """Suspends or resumes a tenant and/or changes its weight and cache policy (the
        running engine follows within the config refresh interval)."""
        ctx.require("admin")
        t = _tenant(ctx, name)
        changes = body.changes()

        def apply() -> Tenant:
            # Both checked before either commits: a refused body changes nothing.
            if body.status not in (None, "active", "suspended"):
                raise InvalidValueError("status must be active or suspended")
            tenant = store.update_tenant(ctx.session, name=name, **changes)
            if body.status is not None:
                tenant = store.set_tenant_status(ctx.session, name=name, status=body.status)
            return tenant

        detail = {**changes, **({"status": body.status} if body.status is not None else {})}
        write(ctx, "tenant.update", f"tenants/{name}", apply, t.id, **detail)
        return tenant_dict(t)

    @router.get("/tenants/{name}/limits")
    def get_limits(ctx: Ctx, name: str, key_id: str | None = None) -> dict[str, Any]:
        """The limits in force for a tenant or one of its keys."""
        _tenant(ctx, name)
        return _limits(store.get_limits(ctx.session, tenant_name=name, key_id=key_id))

    @router.put("/tenants/{name}/limits")
    def set_limits(
        ctx: Ctx, name: str, body: dict[str, Any], key_id: str | None = None
    ) -> dict[str, Any]:
        """Sets limit fields (absent fields keep their value, null clears one)."""
        ctx.require("admin")
        t = _tenant(ctx, name)

        def apply() -> Any:
            unknown = sorted(set(body) - set(store.LIMIT_FIELDS))
            if unknown:  # checked before **body: "session" would collide with a parameter
                raise InvalidValueError(f"unknown limit fields: {', '.join(unknown)}")
            return store.set_limits(ctx.session, tenant_name=name, key_id=key_id, **body)

        limits = write(ctx, "limits.set", f"tenants/{name}/limits", apply, t.id)
        return _limits(limits)

    @router.get("/tenants/{name}/keys")
    def list_keys(
        ctx: Ctx, name: str, limit: Limit = 100, offset: Offset = 0, revoked: bool | None = None
    ) -> dict[str, Any]:
        """A tenant's keys (prefixes only; hashes and secrets are never returned)."""
        t = _tenant(ctx, name)
        query = (
            select(ApiKey).where(ApiKey.tenant_id == t.id).order_by(ApiKey.created_at, ApiKey.id)
        )
        if revoked is not None:
            query = query.where(
                ApiKey.revoked_at.is_not(None) if revoked else ApiKey.revoked_at.is_(None)
            )
        return page(ctx.session, query, limit, offset, key_dict)

    @router.post("/tenants/{name}/keys", status_code=201)
    def create_key(ctx: Ctx, name: str, body: KeyCreate) -> dict[str, Any]:
        """Creates a key; its secret is in this response only."""
        ctx.require("admin", "tenant-admin")
        t = _tenant(ctx, name)
        created = write(
            ctx,
            "key.create",
            f"tenants/{name}/keys",
            lambda: store.create_key(
                ctx.session,
                tenant_name=name,
                pepper=services.pepper,
                name=body.name,
                allowed_models=body.allowed_models,
                expires_in_days=body.expires_in_days,
            ),
            t.id,
        )
        return {
            "id": created.id,
            "tenant_id": created.tenant_id,
            "prefix": created.prefix,
            "secret": created.secret,
        }

    @router.post("/tenants/{name}/keys/{key_id}/revoke")
    def revoke_key(ctx: Ctx, name: str, key_id: str) -> dict[str, Any]:
        """Revokes one of the tenant's keys."""
        ctx.require("admin", "tenant-admin")
        t = _tenant(ctx, name)
        key = ctx.session.get(ApiKey, key_id)
        if key is None or key.tenant_id != t.id:
            raise HTTPException(404, "no such key")
        return key_dict(
            write(
                ctx,
                "key.revoke",
                f"keys/{key_id}",
                lambda: store.revoke_key(ctx.session, key_id=key_id),
                t.id,
            )
        )

    @router.get("/models")
    def list_models(
        ctx: Ctx, limit: Limit = 100, offset: Offset = 0, status: str | None = None
    ) -> dict[str, Any]:
        """Registered models with their current prices."""
        ctx.require("admin", "viewer")
        rows = registry.list_models(ctx.session, status=status)
        items = [model_dict(ctx.session, m) for m in rows[offset : offset + limit]]
        return {"items": items, "total": len(rows), "limit": limit, "offset": offset}

    @router.post("/models", status_code=201)
    def register_model(ctx: Ctx, body: ModelCreate) -> dict[str, Any]:
        """Registers a model with its first price; its source must lie under the model roots."""
        ctx.require("admin")
        try:
            check_source(body.source, services.settings.model_roots)
        except SourcePathError as exc:
            ctx.audit("model.register", f"models/{body.name}", outcome="invalid")
            raise HTTPException(400, str(exc)) from exc
        prices = body.prices()
        m = write(
            ctx,
            "model.register",
            f"models/{body.name}",
            lambda: registry.register_model(
                ctx.session,
                name=body.name,
                source=body.source,
                format=body.format,
                context_length=body.context_length,
                revision=body.revision,
                prices=prices,
                allowed_tenants=body.allowed_tenants,
            ),
        )
        return model_dict(ctx.session, m)

    @router.get("/models/{name}")
    def get_model(ctx: Ctx, name: str) -> dict[str, Any]:
        """One model with its price history."""
        ctx.require("admin", "viewer")
        try:
            m = registry.get_model(ctx.session, name)
        except NotFoundError as exc:
            raise HTTPException(404, str(exc)) from exc
        return model_dict(ctx.session, m, history=True)

    @router.patch("/models/{name}")
    def update_model(ctx: Ctx, name: str, body: ModelUpdate) -> dict[str, Any]:
        """Changes status (registered, loaded, retired) or the tenant allow-list."""
        ctx.require("admin")
        m = write(
            ctx,
            "model.update",
            f"models/{name}",
            lambda: registry.update_model(
                ctx.session,
                name=name,
                status=body.status,
                allowed_tenants=body.allowed_tenants,
                clear_allowed_tenants=body.clear_allowed_tenants,
            ),
        )
        return model_dict(ctx.session, m)

    @router.post("/models/{name}/prices", status_code=201)
    def set_price(ctx: Ctx, name: str, body: PriceCreate) -> dict[str, Any]:
        """Adds a price from `effective_from`; usage before it keeps the old price."""
        ctx.require("admin")
        prices = registry.Prices(body.input_price, body.cached_input_price, body.output_price)
        write(
            ctx,
            "model.price",
            f"models/{name}/prices",
            lambda: registry.set_price(
                ctx.session, model=name, prices=prices, effective_from=body.effective_from
            ),
        )
        return model_dict(ctx.session, registry.get_model(ctx.session, name), history=True)

    from admin.router_ops import add_ops_routes

    add_ops_routes(router, services, Ctx, Limit, Offset, write)
    return router


def _limits(limits: Any) -> dict[str, Any]:
    import dataclasses

    out = dataclasses.asdict(limits)
    out["allowed_models"] = (
        sorted(limits.allowed_models) if limits.allowed_models is not None else None
    )
    out["key_scoped"] = sorted(limits.key_scoped)
    return out
