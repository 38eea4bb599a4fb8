"""Checks of the Batch API's object-store settings (CLOISTER_FILES_S3_*), kept apart from
the settings class so that a value that cannot work is refused at start with its name.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# S3's bucket naming rules (lower case, digits, dots, hyphens; 3 to 63 characters).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
MAX_PREFIX_CHARS = 256


def check_bucket(value: str) -> str:
    """An S3 bucket name, or "" (files in the data directory)."""
    value = value.strip()
    if value and _BUCKET.fullmatch(value) is None:
        raise ValueError(
            f"{value[:80]!r} is not an S3 bucket name (3-63 lower-case letters, digits, "
            "dots and hyphens)"
        )
    return value


def check_endpoint_url(value: str | None) -> str | None:
    """An http(s)://host[:port][/path] URL without credentials, or None (AWS itself)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(
            "the object store endpoint must be an http:// or https:// URL (e.g. http://minio:9000)"
        )
    if parts.username is not None or parts.password is not None:
        # A URL is logged and shown; a secret in it would be too.
        raise ValueError(
            "the object store endpoint URL must not hold credentials; set "
            "CLOISTER_FILES_S3_ACCESS_KEY_ID and CLOISTER_FILES_S3_SECRET_ACCESS_KEY"
        )
    if parts.query or parts.fragment:
        raise ValueError("the object store endpoint URL must not have a query or fragment")
    return value.rstrip("/")


def check_prefix(value: str) -> str:
    """The key prefix without outer slashes: path segments of safe characters, no '..'."""
    value = value.strip().strip("/")
    if not value:
        return ""
    segments = value.split("/")
    if (
        len(value) > MAX_PREFIX_CHARS
        or _PREFIX.fullmatch(value) is None
        or any(s in (".", "..") for s in segments)
    ):
        raise ValueError(
            "the object key prefix is path segments of letters, digits, '.', '_' and '-' "
            f"(at most {MAX_PREFIX_CHARS} characters, no '..')"
        )
    return value


def check_combination(
    bucket: str, endpoint_url: str | None, key_id: str | None, has_secret: bool
) -> None:
    """Refuses settings that only half configure the store: an endpoint or keys without a
    bucket would silently keep files on the local disk; one key without the other would
    fall back to another identity."""
    if not bucket and (endpoint_url or key_id or has_secret):
        raise ValueError(
            "CLOISTER_FILES_S3_BUCKET must be set when the endpoint or keys of the files' "
            "object store are"
        )
    if bool(key_id) != has_secret:
        raise ValueError(
            "set both CLOISTER_FILES_S3_ACCESS_KEY_ID and CLOISTER_FILES_S3_SECRET_ACCESS_KEY, "
            "or neither (then boto3's own chain: AWS_ACCESS_KEY_ID, AWS_PROFILE, a role)"
        )
