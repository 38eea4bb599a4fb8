"""A new tenant's cache policy, as the admin API and the CLI show it: the tests of
both compare what they set against it."""

from __future__ import annotations

from typing import Any

DEFAULT_CACHE_POLICY: dict[str, Any] = {
    "weight": 1.0,
    "cache_floor_blocks": None,
    "cache_floor_share": None,
    "retention_ttl_s": None,
    "scrub_on_free": None,
    "never_cache": False,
    "kv_quota_blocks": None,
}
