"""Admin routes for adapters, shared prefixes, usage, billing, audit, admin tokens and OIDC."""

import base64
import datetime as dt
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any, Literal

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse, RedirectResponse
from sqlalchemy import select

from admin import billing, registry
from admin.adapter_upload import dims_from_source, store_adapter, validate_adapter
from admin.audit_chain import public_hex
from admin.billing_export import build_statement, render_statement
from admin.deps import AdminServices
from admin.errors import AdapterValidationError, Unauthenticated
from admin.identity import create_admin_token, issue_session, revoke_admin_token
from admin.models import AdminToken, AuditEvent, LoraAdapter
from admin.oidc import OidcClient
from admin.serialize import adapter_dict, page, prefix_dict, token_dict
from admin.source_paths import SourcePathError, check_source
from admin.upload_intake import UploadSlots, new_upload_dir, receive_to_file, remove_upload_dir
from tenancy import store
from tenancy.errors import InvalidValueError, NotFoundError

OIDC_COOKIE = "cloister_oidc"
UPLOAD_CONCURRENCY = 2  # adapter uploads received and validated at once


def _sign(session_key: str, payload: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
    mac = hmac.new(
        hashlib.sha256(b"oidc:" + session_key.encode()).digest(), body.encode(), hashlib.sha256
    )
    return f"{body}.{mac.hexdigest()}"


def _unsign(session_key: str, value: str) -> dict[str, Any]:
    if not value.isascii():  # a forged cookie; compare_digest refuses non-ASCII str
        raise Unauthenticated("bad sign-in state")
    body, _, mac = value.rpartition(".")
    key = hashlib.sha256(b"oidc:" + session_key.encode()).digest()
    if not hmac.compare_digest(mac, hmac.new(key, body.encode(), hashlib.sha256).hexdigest()):
        raise Unauthenticated("bad sign-in state")
    data: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body))
    return data


def add_ops_routes(
    router: APIRouter, services: AdminServices, Ctx: Any, Limit: Any, Offset: Any, write: Any
) -> None:
    """Adds the remaining routes to `router` (split from router.py for size)."""
    from admin.router import AdapterCreate, PrefixCreate, StatusUpdate, TokenCreate

    @router.get("/adapters")
    def list_adapters(
        ctx: Ctx, limit: Limit = 100, offset: Offset = 0, base_model: str | None = None
    ) -> dict[str, Any]:
        """LoRA adapters."""
        ctx.require("admin", "viewer")
        query = select(LoraAdapter).order_by(LoraAdapter.name)
        if base_model:
            query = query.where(LoraAdapter.base_model == base_model)
        return page(ctx.session, query, limit, offset, adapter_dict)

    def owner_id(ctx: Any, owner: str | None) -> str | None:
        if owner is None:
            return None
        try:
            return store.get_tenant(ctx.session, owner).id
        except NotFoundError as exc:
            raise HTTPException(404, str(exc)) from exc

    roots = services.settings.model_roots
    data_dir = Path(services.settings.spool_path).parent
    upload_slots = UploadSlots(UPLOAD_CONCURRENCY)

    @router.post("/adapters", status_code=201)
    def register_adapter(ctx: Ctx, body: AdapterCreate) -> dict[str, Any]:
        """Registers an adapter already on disk (PEFT folder, under the model roots)."""
        ctx.require("admin")
        resource = f"adapters/{body.name}"
        try:
            check_source(body.source_path, roots)
        except SourcePathError as exc:
            ctx.audit("adapter.register", resource, outcome="invalid")
            raise HTTPException(400, str(exc)) from exc
        owner = owner_id(ctx, body.owner_tenant)
        a = write(
            ctx,
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
        )
        return adapter_dict(a)

    def refused(ctx: Any, name: str, exc: HTTPException, outcome: str) -> HTTPException:
        """Audits a refused upload; returns `exc` to raise."""
        ctx.audit("adapter.upload", f"adapters/{name}", outcome=outcome, status=exc.status_code)
        return exc

    def finish_upload(
        ctx: Any, archive: Path, name: str, base_model: str, owner_tenant: str | None
    ) -> dict[str, Any]:
        # Runs in a worker thread: database, inflate and disk work never touch the event loop.
        try:
            base = registry.get_model(ctx.session, base_model)
            workdir = archive.parent / "unpacked"
            workdir.mkdir()
            validated = validate_adapter(
                archive,
                workdir,
                base_model=base_model,
                base_aliases={base.name, base.source},
                dims=dims_from_source(base.source, roots),
            )
            owner = owner_id(ctx, owner_tenant)
        except NotFoundError as exc:
            raise refused(ctx, name, HTTPException(404, str(exc)), "error") from exc
        except AdapterValidationError as exc:
            raise refused(ctx, name, HTTPException(400, str(exc)), "invalid") from exc
        except HTTPException as exc:  # owner_id's 404
            raise refused(ctx, name, exc, "error") from exc
        conflict = HTTPException(409, f"adapter {name!r} already exists")
        if ctx.session.scalars(select(LoraAdapter.id).where(LoraAdapter.name == name)).first():
            raise refused(ctx, name, conflict, "error")
        folder = data_dir / "adapters" / hashlib.sha256(name.encode()).hexdigest()[:16]
        try:
            store_adapter(validated, folder)
        except OSError as exc:  # a concurrent upload of the same name stored its files first
            raise refused(ctx, name, conflict, "error") from exc
        a = write(
            ctx,
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
        )
        return adapter_dict(a)

    def start_upload(ctx: Any, name: str) -> None:
        # Role check, name check and slot, in a worker thread: each may write an audit record.
        ctx.require("admin")
        try:
            registry.check_adapter_name(name)
        except InvalidValueError as exc:
            raise refused(ctx, name, HTTPException(400, str(exc)), "invalid") from exc
        try:
            upload_slots.acquire()
        except HTTPException as exc:
            raise refused(ctx, name, exc, "busy") from exc
        finally:
            # The session would otherwise hold a pooled connection while the body streams in.
            ctx.session.close()

    @router.post("/adapters/upload", status_code=201)
    async def upload_adapter(
        ctx: Ctx,
        request: Request,
        name: str = Query(),
        base_model: str = Query(),
        owner_tenant: str | None = None,
    ) -> dict[str, Any]:
        """Uploads a PEFT adapter folder as a zip body; validated before it is registered.

        The body streams to a file in the data directory under the size cap; the checks
        run in a worker thread, a bounded number at a time (429 beyond).
        """
        await anyio.to_thread.run_sync(start_upload, ctx, name)
        folder: Path | None = None
        try:
            folder = await anyio.to_thread.run_sync(new_upload_dir, data_dir / "uploads")
            archive = folder / "adapter.zip"
            try:
                await receive_to_file(request, archive, services.settings.adapter_upload_max_bytes)
            except HTTPException as exc:
                raise await anyio.to_thread.run_sync(refused, ctx, name, exc, "invalid") from exc
            return await anyio.to_thread.run_sync(
                finish_upload, ctx, archive, name, base_model, owner_tenant
            )
        finally:
            if folder is not None:
                await anyio.to_thread.run_sync(remove_upload_dir, folder)
            upload_slots.release()

    @router.patch("/adapters/{name}")
    def update_adapter(ctx: Ctx, name: str, body: StatusUpdate) -> dict[str, Any]:
        """Changes an adapter's status."""
        ctx.require("admin")
        return adapter_dict(
            write(
                ctx,
                "adapter.update",
                f"adapters/{name}",
                lambda: registry.set_adapter_status(ctx.session, name=name, status=body.status),
            )
        )

    @router.get("/prefixes")
    def list_prefixes(ctx: Ctx, model: str | None = None) -> dict[str, Any]:
        """Published shared prefixes."""
        ctx.require("admin", "viewer")
        items = [prefix_dict(p) for p in registry.list_prefixes(ctx.session, model=model)]
        return {"items": items, "total": len(items)}

    @router.post("/prefixes", status_code=201)
    def publish_prefix(ctx: Ctx, body: PrefixCreate) -> dict[str, Any]:
        """Publishes a shared prefix into the public cache domain."""
        ctx.require("admin")
        return prefix_dict(
            write(
                ctx,
                "prefix.publish",
                f"prefixes/{body.name}",
                lambda: registry.publish_prefix(
                    ctx.session,
                    name=body.name,
                    model=body.model,
                    token_ids=body.token_ids,
                    text=body.text,
                ),
            )
        )

    @router.delete("/prefixes/{name}")
    def withdraw_prefix(ctx: Ctx, name: str) -> dict[str, Any]:
        """Withdraws a published prefix: the running engines stop sharing it within the
        config refresh interval."""
        ctx.require("admin")
        return prefix_dict(
            write(
                ctx,
                "prefix.withdraw",
                f"prefixes/{name}",
                lambda: registry.withdraw_prefix(ctx.session, name=name),
            )
        )

    def scoped_tenant(ctx: Any, tenant: str | None) -> str | None:
        """The tenant filter to apply: a tenant-admin is pinned to its own tenant."""
        if ctx.identity.role != "tenant-admin":
            return tenant
        if tenant is not None and tenant != ctx.identity.tenant_id:
            ctx.deny(404, "not found")
        return str(ctx.identity.tenant_id)

    @router.get("/usage")
    def usage(
        ctx: Ctx,
        start: dt.datetime,
        end: dt.datetime,
        granularity: Literal["hour", "day"] = "day",
        tenant_id: str | None = None,
        key_id: str | None = None,
        model: str | None = None,
        adapter: str | None = None,
        by_key: bool = False,
    ) -> dict[str, Any]:
        """Usage per hour or day, by tenant, key, model or adapter."""
        tenant = scoped_tenant(ctx, tenant_id)
        if start.tzinfo is None or end.tzinfo is None:
            raise HTTPException(422, "start and end need a time zone")
        buckets = billing.query_usage(
            ctx.session,
            start=start,
            end=end,
            granularity=granularity,
            tenant_id=tenant,
            key_id=key_id,
            model=model,
            adapter=adapter,
            by_key=by_key,
        )
        return {"items": [{**b.__dict__, "unpriced": b.unpriced} for b in buckets]}

    @router.get("/billing/export")
    def billing_export(
        ctx: Ctx, period: str, format: str = "csv", tenant_id: str | None = None
    ) -> PlainTextResponse:
        """Billing lines of a period (YYYY-MM or YYYY-MM-DD) as CSV or JSON lines."""
        tenant = scoped_tenant(ctx, tenant_id)
        if format not in ("csv", "jsonl"):
            raise HTTPException(422, "format must be csv or jsonl")
        try:
            statement = build_statement(ctx.session, period=period, tenant_id=tenant)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        ctx.audit("billing.export", f"billing/{period}", tenant_id=tenant, format=format)
        media = "text/csv" if format == "csv" else "application/x-ndjson"
        return PlainTextResponse(render_statement(statement, format), media_type=media)

    @router.get("/audit")
    def audit_events(
        ctx: Ctx,
        limit: Limit = 100,
        offset: Offset = 0,
        action: str | None = None,
        outcome: str | None = None,
    ) -> dict[str, Any]:
        """Audit records, newest first."""
        ctx.require("admin", "viewer")
        services.audit_writer.flush()  # what was queued before this call is in the answer
        query = select(AuditEvent).order_by(AuditEvent.seq.desc())
        if action:
            query = query.where(AuditEvent.action == action)
        if outcome:
            query = query.where(AuditEvent.outcome == outcome)
        from admin.audit_log import event_dict

        return page(ctx.session, query, limit, offset, event_dict)

    @router.get("/audit/export")
    def audit_export(ctx: Ctx) -> PlainTextResponse:
        """The whole log as JSON lines with its signed manifest and checkpoints."""
        ctx.require("admin", "viewer")
        ctx.audit("audit.export", "audit")
        services.audit_writer.flush()
        try:
            text = services.audit.export_jsonl()
        except RuntimeError as exc:
            raise HTTPException(409, str(exc)) from exc
        return PlainTextResponse(text, media_type="application/x-ndjson")

    @router.get("/audit/verify")
    def audit_verify(ctx: Ctx) -> dict[str, Any]:
        """Verifies the stored chain and checkpoints."""
        ctx.require("admin", "viewer")
        key = services.settings.audit_signing_key
        if key is None:
            raise HTTPException(409, "no audit signing key configured")
        from admin.audit_chain import load_private_key

        services.audit_writer.flush()
        report = services.audit.verify(
            public_key=public_hex(load_private_key(key.get_secret_value()))
        )
        return report.__dict__

    @router.get("/tokens")
    def list_tokens(ctx: Ctx, limit: Limit = 100, offset: Offset = 0) -> dict[str, Any]:
        """Admin tokens by prefix."""
        ctx.require("admin", "viewer")
        return page(
            ctx.session,
            select(AdminToken).order_by(AdminToken.created_at),
            limit,
            offset,
            token_dict,
        )

    @router.post("/tokens", status_code=201)
    def create_token(ctx: Ctx, body: TokenCreate) -> dict[str, Any]:
        """Creates an admin token; the secret is in this response only."""
        ctx.require("admin")
        created = write(
            ctx,
            "token.create",
            f"tokens/{body.role}",
            lambda: create_admin_token(
                ctx.session,
                pepper=services.pepper,
                role=body.role,
                tenant_name=body.tenant,
                name=body.name,
            ),
        )
        return {
            "id": created.id,
            "role": created.role,
            "tenant_id": created.tenant_id,
            "token": created.secret,
        }

    @router.post("/tokens/{token_id}/revoke")
    def revoke_token(ctx: Ctx, token_id: str) -> dict[str, Any]:
        """Revokes an admin token."""
        ctx.require("admin")
        return token_dict(
            write(
                ctx,
                "token.revoke",
                f"tokens/{token_id}",
                lambda: revoke_admin_token(ctx.session, token_id=token_id),
            )
        )

    @router.get("/auth/login")
    def oidc_login() -> RedirectResponse:
        """Starts OIDC sign-in: redirects to the issuer (PKCE S256)."""
        try:
            start = OidcClient(services.settings).start()
        except Unauthenticated as exc:
            raise HTTPException(404, str(exc)) from exc
        response = RedirectResponse(start.url, status_code=302)
        cookie = _sign(
            services.session_key,
            {"state": start.state, "nonce": start.nonce, "verifier": start.code_verifier},
        )
        response.set_cookie(OIDC_COOKIE, cookie, max_age=600, httponly=True, samesite="lax")
        return response

    @router.get("/auth/callback")
    def oidc_callback(request: Request, code: str, state: str) -> dict[str, Any]:
        """Finishes OIDC sign-in; returns a session token for the Authorization header."""
        from admin.deps import record_request

        try:
            saved = _unsign(services.session_key, request.cookies.get(OIDC_COOKIE, "."))
            if not state.isascii() or not hmac.compare_digest(saved["state"], state):
                raise Unauthenticated("state mismatch")
            identity = OidcClient(services.settings).finish(
                code=code, code_verifier=saved["verifier"], nonce=saved["nonce"]
            )
        except (Unauthenticated, ValueError, KeyError, TypeError) as exc:
            record_request(
                services.audit_writer,
                request,
                None,
                "auth.oidc",
                "auth/callback",
                "denied:401",
                None,
                None,
            )
            raise HTTPException(401, str(exc)) from exc
        record_request(
            services.audit_writer,
            request,
            identity,
            "auth.oidc",
            "auth/callback",
            "success",
            None,
            None,
        )
        token = issue_session(services.session_key, identity, services.settings.session_ttl_s)
        return {
            "token": token,
            "actor": identity.actor,
            "role": identity.role,
            "tenant_id": identity.tenant_id,
        }
