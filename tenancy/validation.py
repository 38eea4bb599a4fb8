"""Bounds on the values the store accepts, shared by the CLI and the admin API.

Each check raises `InvalidValueError` with a message fit to show the caller; the
store calls them, so every interface enforces the same rules.
"""

from __future__ import annotations

import math
import re
from typing import Any

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


def check_weight(weight: Any) -> float:
    """A finite scheduling weight in [MIN_WEIGHT, MAX_WEIGHT], else InvalidValueError."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or not MIN_WEIGHT <= weight <= MAX_WEIGHT
    ):
        raise InvalidValueError(f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    return float(weight)


def check_key_name(name: Any, *, what: str = "key name") -> str | None:
    """A key (or token) label of at most MAX_KEY_NAME characters (None: no label)."""
    if name is None:
        return None
    if not isinstance(name, str) or len(name) > MAX_KEY_NAME or "\x00" in name:
        raise InvalidValueError(f"{what} must be at most {MAX_KEY_NAME} characters, without NUL")
    return name


def check_expires_in_days(days: Any) -> float | None:
    """A finite expiry in (0, MAX_EXPIRES_IN_DAYS] days (None: never expires)."""
    if days is None:
        return None
    if (
        isinstance(days, bool)
        or not isinstance(days, int | float)
        or not math.isfinite(days)
        or not 0 < days <= MAX_EXPIRES_IN_DAYS
    ):
        raise InvalidValueError(
            f"expires-in-days must be positive and at most {MAX_EXPIRES_IN_DAYS}"
        )
    return float(days)


def check_limit_int(field: str, value: Any) -> int:
    """A counted limit: an integer from 0 to MAX_LIMIT_VALUE."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LIMIT_VALUE:
        raise InvalidValueError(f"{field} must be an integer from 0 to {MAX_LIMIT_VALUE}")
    return value
