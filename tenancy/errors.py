"""Typed tenancy errors.

The gateway maps each to HTTP once, at its edge: `AuthenticationError` -> 401,
`PermissionDeniedError` -> 403, `RateLimitedError` -> 429 with Retry-After and
x-ratelimit-* headers, `LimiterUnavailableError` and `AuthUnavailableError` -> 503,
`AuthThrottledError` -> 429 with Retry-After. Store errors
(`NotFoundError`, `ConflictError`, `InvalidValueError`) are for the CLI and admin API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AuthFailure = Literal["missing", "invalid", "expired", "revoked", "suspended"]
RateLimitReason = Literal["requests", "tokens", "concurrency", "budget", "tokens_in_flight"]


class TenancyError(Exception):
    """Base class for every error the tenancy layer raises on purpose."""


class AuthenticationError(TenancyError):
    """The bearer credential does not identify an active key of an active tenant."""

    def __init__(self, reason: AuthFailure, message: str | None = None) -> None:
        super().__init__(message or f"authentication failed: {reason}")
        self.reason: AuthFailure = reason


class PermissionDeniedError(TenancyError):
    """The principal may not use the requested model (or adapter)."""

    def __init__(self, model: str, message: str | None = None) -> None:
        super().__init__(message or f"this key may not use model {model!r}")
        self.model = model


@dataclass(frozen=True)
class RateInfo:
    """One x-ratelimit-* triple: the limit, what is left, seconds until it is full again."""

    limit: int
    remaining: int
    reset_s: float


class RateLimitedError(TenancyError):
    """The request was denied by a limit; nothing was consumed. Retry after `retry_after_s`."""

    def __init__(
        self,
        reason: RateLimitReason,
        retry_after_s: float,
        *,
        requests: RateInfo | None = None,
        tokens: RateInfo | None = None,
        message: str | None = None,
    ) -> None:
        super().__init__(message or f"rate limited ({reason}); retry after {retry_after_s:.3f}s")
        self.reason: RateLimitReason = reason
        self.retry_after_s = retry_after_s
        self.requests = requests
        self.tokens = tokens


class LimiterUnavailableError(TenancyError):
    """The shared limiter backend is unreachable and the fail mode is "closed"."""


class AuthUnavailableError(TenancyError):
    """The key store cannot be read right now and no cached answer is fresh enough."""

    def __init__(self, message: str = "authentication is unavailable", retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AuthThrottledError(TenancyError):
    """Too many failed credentials from one source in the current window; retry later."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("too many failed authentication attempts; retry later")
        self.retry_after_s = retry_after_s


class NotFoundError(TenancyError):
    """A named tenant or key does not exist."""


class ConflictError(TenancyError):
    """A unique name is already taken."""


class InvalidValueError(TenancyError, ValueError):
    """A value given to the store is out of range or malformed."""
