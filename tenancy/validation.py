"""Bounds on the values the store accepts, shared by the CLI and the admin API.

Each check raises `InvalidValueError` with a message fit to show the caller; the
store calls them, so every interface enforces the same rules.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, TypeGuard

from tenancy.errors import InvalidValueError

# A tenant name is also a path segment of the admin API and a label in metrics and
# exports: no "/", no control characters, no leading dot or dash.
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
MIN_WEIGHT = 0.01
MAX_WEIGHT = 100.0
MAX_KEY_NAME = 128
# 100 years: further than any real expiry, and well inside datetime's range.
MAX_EXPIRES_IN_DAYS = 36_500
# Limits are stored in (32-bit signed) INTEGER columns on every backend.
MAX_LIMIT_VALUE = 2**31 - 1


def check_tenant_name(name: Any) -> str:
    """`name` if it matches TENANT_NAME, else InvalidValueError."""
    if not isinstance(name, str) or TENANT_NAME.fullmatch(name) is None:
        raise InvalidValueError(
            "tenant name must be 1-63 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def _is_finite_number(value: Any) -> bool:
    """An int or float that is finite; a bool is not a number here (True == 1)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _optional_positive(value: Any, high: float, error: str) -> float | None:
    """None, or `value` as a float if it is a finite number in (0, `high`]; else
    InvalidValueError(`error`)."""
    if value is None:
        return None
    if not _is_finite_number(value) or not 0 < value <= high:
        raise InvalidValueError(error)
    return float(value)


def check_weight(weight: Any) -> float:
    """A finite scheduling weight in [MIN_WEIGHT, MAX_WEIGHT], else InvalidValueError."""
    if not _is_finite_number(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise InvalidValueError(f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    return float(weight)


def _has_control_chars(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def check_key_name(name: Any, *, what: str = "key name") -> str | None:
    """A key (or token) label: 1 to MAX_KEY_NAME characters, not blank, no control
    characters (it is shown in one-line listings and logs); None: no label."""
    if name is None:
        return None
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > MAX_KEY_NAME
        or _has_control_chars(name)
    ):
        raise InvalidValueError(
            f"{what} must be 1-{MAX_KEY_NAME} characters, not blank, without control characters"
        )
    return name


# Key metadata: a few short labels, shown in listings and the audit log, so never secrets.
MAX_METADATA_ENTRIES = 16
MAX_METADATA_VALUE = 256
METADATA_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Names the audit log scrubs as secrets (admin/audit_log.py): refused here rather than
# stored and shown where the log would hide them.
SECRET_LIKE_NAME = re.compile(r"secret|token|password|authorization|api_key|pepper|signing", re.I)
CREDENTIAL_PREFIXES = ("sk-clo-", "clo-adm-")


def check_key_metadata(metadata: Any) -> dict[str, str] | None:
    """At most MAX_METADATA_ENTRIES string labels; keys like tenant names and not named
    like secrets, values up to MAX_METADATA_VALUE printable characters and no credential.
    An empty mapping or None: no metadata."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidValueError("metadata must be an object of string labels")
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidValueError(f"metadata holds at most {MAX_METADATA_ENTRIES} entries")
    for key, value in metadata.items():
        if not isinstance(key, str) or METADATA_KEY.fullmatch(key) is None:
            raise InvalidValueError(
                "metadata keys must be 1-63 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if SECRET_LIKE_NAME.search(key):
            raise InvalidValueError(f"metadata key {key!r} names a secret; keep secrets out")
        if (
            not isinstance(value, str)
            or len(value) > MAX_METADATA_VALUE
            or _has_control_chars(value)
        ):
            raise InvalidValueError(
                f"metadata value of {key!r} must be at most {MAX_METADATA_VALUE} characters, "
                "without control characters"
            )
        if any(prefix in value for prefix in CREDENTIAL_PREFIXES):
            raise InvalidValueError(f"metadata value of {key!r} holds a credential")
    return dict(sorted(metadata.items())) or None


def check_expires_in_days(days: Any) -> float | None:
    """A finite expiry in (0, MAX_EXPIRES_IN_DAYS] days (None: never expires)."""
    return _optional_positive(
        days,
        MAX_EXPIRES_IN_DAYS,
        f"expires-in-days must be positive and at most {MAX_EXPIRES_IN_DAYS}",
    )


def _is_count(value: Any, low: int) -> TypeGuard[int]:
    """An int from `low` to MAX_LIMIT_VALUE (what an INTEGER column holds); a bool is not
    a count here (True == 1)."""
    return (
        not isinstance(value, bool) and isinstance(value, int) and low <= value <= MAX_LIMIT_VALUE
    )


def _optional_count(value: Any, low: int, error: str) -> int | None:
    """None, or `value` if it is a count from `low` (see `_is_count`); else
    InvalidValueError(`error`)."""
    if value is None:
        return None
    if not _is_count(value, low):
        raise InvalidValueError(error)
    return value


def check_limit_int(field: str, value: Any) -> int:
    """A counted limit: an integer from 0 to MAX_LIMIT_VALUE."""
    if not _is_count(value, 0):
        raise InvalidValueError(f"{field} must be an integer from 0 to {MAX_LIMIT_VALUE}")
    return value


# A floor in blocks is stored in an INTEGER column; a TTL of over a year is a typo.
MAX_RETENTION_TTL_S = 366 * 86_400.0


def check_floor_blocks(value: Any) -> int | None:
    """A cache floor in KV blocks: an integer from 0 to MAX_LIMIT_VALUE (None: none)."""
    return _optional_count(
        value, 0, f"cache floor blocks must be an integer from 0 to {MAX_LIMIT_VALUE}"
    )


def check_floor_share(value: Any) -> float | None:
    """A cache floor as a share of the pool: a number from 0 to 1 (None: none)."""
    if value is None:
        return None
    if not _is_finite_number(value) or not 0 <= value <= 1:
        raise InvalidValueError("cache floor share must be a number from 0 to 1")
    return float(value)


def check_kv_quota_blocks(value: Any) -> int | None:
    """A KV quota: the most KV blocks a tenant's running sequences may hold, an integer
    from 1 to MAX_LIMIT_VALUE (None: no quota). 0 would admit nothing: refused."""
    return _optional_count(
        value,
        1,
        f"kv_quota_blocks (KV quota) must be an integer from 1 to {MAX_LIMIT_VALUE} blocks",
    )


def check_retention_ttl(value: Any) -> float | None:
    """A retention TTL in seconds, in (0, MAX_RETENTION_TTL_S] (None: engine default)."""
    return _optional_positive(
        value,
        MAX_RETENTION_TTL_S,
        f"retention TTL must be a number of seconds above 0 and at most {MAX_RETENTION_TTL_S:g}",
    )


def check_optional_flag(field: str, value: Any) -> bool | None:
    """true, false or None (engine default)."""
    if value is not None and not isinstance(value, bool):
        raise InvalidValueError(f"{field} must be true, false or null")
    return value


def check_flag(field: str, value: Any) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise InvalidValueError(f"{field} must be true or false")
    return value


# A tenant's stream cadence: "token" (each engine event's text as it comes) or "fixed:N"
# (streamed text in chunks of exactly N tokens). Bounded so that a typo cannot make a
# stream a single chunk at its end; 64 tokens is a few lines of text.
STREAM_CADENCE_TOKEN = "token"
MAX_STREAM_CADENCE_TOKENS = 64
_FIXED_CADENCE = re.compile(r"fixed:([1-9][0-9]{0,2})")


def check_stream_cadence(value: Any) -> str:
    """A stream cadence: "token", or "fixed:N" with N an integer from 1 to
    MAX_STREAM_CADENCE_TOKENS; else InvalidValueError naming the field."""
    if value == STREAM_CADENCE_TOKEN:
        return STREAM_CADENCE_TOKEN
    match = _FIXED_CADENCE.fullmatch(value) if isinstance(value, str) else None
    if match is None or not 1 <= int(match.group(1)) <= MAX_STREAM_CADENCE_TOKENS:
        raise InvalidValueError(
            f'stream_cadence must be "token" or "fixed:N" with N an integer from 1 to '
            f"{MAX_STREAM_CADENCE_TOKENS}"
        )
    return match.group(0)


def stream_cadence_tokens(value: str) -> int | None:
    """The chunk size in tokens of a checked cadence; None for "token" (no re-chunking).

    A stored value that no longer parses (edited by hand) reads as the default: the
    gateway must keep streaming, and the store refuses such values on every write."""
    try:
        checked = check_stream_cadence(value)
    except InvalidValueError:
        return None
    if checked == STREAM_CADENCE_TOKEN:
        return None
    return int(checked.removeprefix("fixed:"))
