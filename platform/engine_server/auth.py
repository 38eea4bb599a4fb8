"""The service credential: only gateways may call an engine server.

The token is read from `CLOISTER_SERVICE_TOKEN` on both sides. An engine without one
refuses to start unless it was told `--insecure-loopback`, and then binds 127.0.0.1
only. A tenant's API key is never a service credential: keys and the token are
different secrets, and the comparison is constant-time.
"""

from __future__ import annotations

import hmac

# Shorter tokens are refused at start-up: a guessable credential is no credential.
MIN_TOKEN_LENGTH = 24


class ServiceTokenError(ValueError):
    """The engine server was started without a usable credential."""


class ServiceAuth:
    """Checks `Authorization: Bearer <service token>`; `token=None` admits everyone."""

    def __init__(self, token: str | None) -> None:
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise ServiceTokenError(
                f"the service token must be at least {MIN_TOKEN_LENGTH} characters"
            )
        self._token = None if token is None else token.encode()

    def check(self, authorization: str | None) -> str | None:
        """None when allowed, else the reason to refuse (a 401)."""
        if self._token is None:
            return None
        if not authorization or not authorization.startswith("Bearer "):
            return "a service credential is required"
        given = authorization.removeprefix("Bearer ").strip().encode()
        if not hmac.compare_digest(given, self._token):
            return "the service credential is not valid"
        return None
