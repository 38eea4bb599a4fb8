"""Who is calling, OIDC sign-in (PKCE) and the console's public sign-in options."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse

from admin.body_cap import CappedJsonRoute
from admin.deps import Ctx, ServicesDep, allow, record_request
from admin.errors import Unauthenticated
from admin.identity import issue_session
from admin.oidc import OidcClient
from admin.roles import EVERY_ROLE
from admin.schemas.auth import ConsoleConfig, SessionCreated, WhoAmI

OIDC_COOKIE = "cloister_oidc"
router = APIRouter(tags=["auth"], route_class=CappedJsonRoute)


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


@router.get("/whoami", dependencies=[allow(EVERY_ROLE)])
def whoami(ctx: Ctx) -> WhoAmI:
    """The caller's identity."""
    i = ctx.identity
    return WhoAmI(actor=i.actor, role=i.role, tenant_id=i.tenant_id)


@router.get("/console/config")
def console_config(services: ServicesDep) -> ConsoleConfig:
    """Public sign-in options (no secrets): whether OIDC is configured."""
    s = services.settings
    return ConsoleConfig(oidc=bool(s.oidc_issuer and s.oidc_client_id))


@router.get("/auth/login")
def oidc_login(services: ServicesDep) -> RedirectResponse:
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
def oidc_callback(request: Request, services: ServicesDep, code: str, state: str) -> SessionCreated:
    """Finishes OIDC sign-in; returns a session token for the Authorization header."""
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
    return SessionCreated(
        token=token, actor=identity.actor, role=identity.role, tenant_id=identity.tenant_id
    )
