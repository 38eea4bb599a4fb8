"""OpenID Connect sign-in (authorization code + PKCE) through authlib, against any issuer.

/auth/login    -> redirect to the issuer with state, nonce and an S256 challenge;
                  the verifier rides in a short-lived signed cookie
/auth/callback -> exchange the code (with the verifier), validate the ID token
                  (signature via the issuer's JWKS, iss, aud, exp, nonce), map
                  claims to a role, return a session token
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.common.security import generate_token
from authlib.integrations.httpx_client import OAuth2Client
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from admin.errors import Unauthenticated
from admin.identity import AdminIdentity, check_role
from admin.settings import AdminSettings


@dataclass(frozen=True)
class LoginStart:
    """Where to send the browser, and what to remember until the callback."""

    url: str
    state: str
    nonce: str
    code_verifier: str


class OidcClient:
    """One issuer's client; discovery and JWKS are fetched on first use."""

    def __init__(self, settings: AdminSettings, *, http: httpx.Client | None = None) -> None:
        if not (settings.oidc_issuer and settings.oidc_client_id and settings.oidc_redirect_uri):
            raise Unauthenticated("OIDC is not configured")
        self._s = settings
        self._http = http or httpx.Client(timeout=10)
        self._metadata: dict[str, Any] | None = None

    def metadata(self) -> dict[str, Any]:
        """The issuer's discovery document."""
        if self._metadata is None:
            url = str(self._s.oidc_issuer).rstrip("/") + "/.well-known/openid-configuration"
            response = self._http.get(url)
            response.raise_for_status()
            self._metadata = response.json()
        return self._metadata

    def _client(self) -> OAuth2Client:
        secret = self._s.oidc_client_secret
        return OAuth2Client(
            client_id=self._s.oidc_client_id,
            client_secret=secret.get_secret_value() if secret else None,
            redirect_uri=self._s.oidc_redirect_uri,
            scope=self._s.oidc_scopes,
            code_challenge_method="S256",
            token_endpoint_auth_method="client_secret_post" if secret else "none",
        )

    def start(self) -> LoginStart:
        """A fresh authorization URL with PKCE (S256), state and nonce."""
        verifier = generate_token(48)
        nonce = generate_token(24)
        with self._client() as client:
            url, state = client.create_authorization_url(
                self.metadata()["authorization_endpoint"], code_verifier=verifier, nonce=nonce
            )
        return LoginStart(url=url, state=state, nonce=nonce, code_verifier=verifier)

    def finish(self, *, code: str, code_verifier: str, nonce: str) -> AdminIdentity:
        """Exchanges the code and returns the identity from the validated ID token."""
        with self._client() as client:
            try:
                token = client.fetch_token(
                    self.metadata()["token_endpoint"],
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=code_verifier,
                )
            except Exception as exc:
                raise Unauthenticated("the issuer refused the authorization code") from exc
        id_token = token.get("id_token")
        if not id_token:
            raise Unauthenticated("the issuer returned no ID token")
        return self.identity_from_id_token(str(id_token), nonce=nonce)

    def identity_from_id_token(self, id_token: str, *, nonce: str | None) -> AdminIdentity:
        """Validates signature, issuer, audience, expiry and nonce; maps claims to a role."""
        jwks = self._http.get(self.metadata()["jwks_uri"])
        jwks.raise_for_status()
        try:
            decoded = jwt.decode(
                id_token, KeySet.import_key_set(jwks.json()), algorithms=["RS256", "ES256"]
            )
            options: dict[str, Any] = {
                "iss": {"essential": True, "value": str(self._s.oidc_issuer)},
                "aud": {"essential": True, "value": self._s.oidc_client_id},
                "exp": {"essential": True},
                "sub": {"essential": True},
            }
            if nonce is not None:
                options["nonce"] = {"essential": True, "value": nonce}
            jwt.JWTClaimsRegistry(now=int(time.time()), leeway=30, **options).validate(
                decoded.claims
            )
        except (JoseError, ValueError) as exc:
            raise Unauthenticated(f"ID token refused: {exc}") from exc
        claims = decoded.claims
        role = claims.get(self._s.oidc_role_claim) or self._s.oidc_default_role
        if role is None:
            raise Unauthenticated("the ID token grants no admin role")
        tenant = claims.get(self._s.oidc_tenant_claim) if role == "tenant-admin" else None
        try:
            checked = check_role(str(role), tenant)
        except ValueError as exc:
            raise Unauthenticated(str(exc)) from exc
        actor = f"oidc:{claims.get('email') or claims['sub']}"
        name = claims.get("name") or claims.get("email")
        return AdminIdentity(
            actor=actor, role=checked, tenant_id=tenant, name=str(name) if name else None
        )
