"""The Batch API's refusals, each carrying its HTTP shape (mapped once, by gateway.errors)."""

from __future__ import annotations

import re

from gateway.errors import GatewayError

# Every file and batch id this server makes matches this; anything else is "not found"
# before any database sees it (PostgreSQL refuses a NUL in a text literal).
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ResourceNotFoundError(GatewayError):
    """No file or batch of that id belongs to the caller's tenant (404, whether it exists
    for another tenant or not at all, so ids never leak)."""

    status = 404


class UploadTooLargeError(GatewayError):
    """An upload over the size or line cap: refused while it streams in (413)."""

    status = 413


class QuotaExceededError(GatewayError):
    """The tenant holds as many files or bytes, or queued batch tokens, as it may (429)."""

    status = 429


class BatchStateError(GatewayError):
    """The batch cannot do that in its current status (e.g. cancel a completed one; 409)."""

    status = 409


def well_formed_id(value: str | None) -> bool:
    """Whether `value` could be an id this server made (a NUL, a slash or 10 kB cannot)."""
    return value is not None and _ID.fullmatch(value) is not None
