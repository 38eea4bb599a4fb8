"""A small OpenID provider for tests: discovery, JWKS, authorize and token with PKCE (S256).

ID tokens are RS256 JWTs signed with a key made per provider. Knobs let a test
make the provider misbehave (wrong audience, expired token, foreign signature).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import RedirectResponse
from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.utils.services import free_port


@dataclass
class Provider:
    """Provider state and the claims its next ID token will carry."""

    issuer: str
    client_id: str
    key: RSAKey = field(default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "k1"}))
    claims: dict[str, Any] = field(default_factory=dict)
    audience: str | None = None  # override the aud claim
    expired: bool = False
    foreign_key: RSAKey | None = None  # sign with a key not in the JWKS
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def app(self) -> FastAPI:
        """The provider's HTTP endpoints."""
        app = FastAPI()

        @app.get("/.well-known/openid-configuration")
        def discovery() -> dict[str, Any]:
            return {
                "issuer": self.issuer,
                "authorization_endpoint": self.issuer + "/authorize",
                "token_endpoint": self.issuer + "/token",
                "jwks_uri": self.issuer + "/jwks",
                "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
                "id_token_signing_alg_values_supported": ["RS256"],
            }

        @app.get("/jwks")
        def jwks() -> dict[str, Any]:
            return {"keys": [self.key.as_dict(private=False)]}

        @app.get("/authorize")
        def authorize(
            client_id: str,
            redirect_uri: str,
            state: str,
            nonce: str,
            code_challenge: str,
            code_challenge_method: str,
        ) -> RedirectResponse:
            if client_id != self.client_id or code_challenge_method != "S256":
                raise HTTPException(400, "bad request")
            code = secrets.token_urlsafe(16)
            self.codes[code] = {
                "challenge": code_challenge,
                "nonce": nonce,
                "redirect_uri": redirect_uri,
            }
            return RedirectResponse(
                redirect_uri + "?" + urlencode({"code": code, "state": state}), 302
            )

        @app.post("/token")
        async def token(request: Request) -> dict[str, Any]:
            form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
            grant_type, code = form.get("grant_type"), form.get("code", "")
            code_verifier, client_id = form.get("code_verifier", ""), form.get("client_id")
            grant = self.codes.pop(code, None)
            if grant is None or grant_type != "authorization_code" or client_id != self.client_id:
                raise HTTPException(400, "invalid_grant")
            if create_s256_code_challenge(code_verifier) != grant["challenge"]:
                raise HTTPException(400, "invalid_grant: PKCE")
            now = int(time.time())
            claims = {
                "iss": self.issuer,
                "sub": "user-1",
                "aud": self.audience or self.client_id,
                "iat": now,
                "exp": now - 3600 if self.expired else now + 300,
                "nonce": grant["nonce"],
                **self.claims,
            }
            key = self.foreign_key or self.key
            id_token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
            return {
                "access_token": secrets.token_urlsafe(8),
                "token_type": "Bearer",
                "id_token": id_token,
            }

        return app


def start_provider(client_id: str) -> tuple[Provider, Any]:
    """Runs a provider on a loopback port; returns it and a stop function."""
    port = free_port()
    provider = Provider(issuer=f"http://127.0.0.1:{port}", client_id=client_id)
    server = uvicorn.Server(
        uvicorn.Config(provider.app(), host="127.0.0.1", port=port, log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("OIDC provider did not start")
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)

    return provider, stop
