"""Plain-HTTP calls to a gateway's OpenAI API (no SDK), for tests that read the raw body."""

from __future__ import annotations

from typing import Any

import httpx


def post_json(
    base_url: str, path: str, key: str, body: Any, timeout: float = 60.0
) -> httpx.Response:
    """POSTs `body` as JSON to `base_url + path` with tenant key `key`."""
    return httpx.post(
        base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout
    )


def post_ok(
    base_url: str, path: str, key: str, body: dict[str, Any], timeout: float = 120.0
) -> dict[str, Any]:
    """POSTs `body` to `base_url + path` with tenant key `key`; asserts a 200 and returns
    the JSON body."""
    r = post_json(base_url, path, key, body, timeout)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def cached_tokens(body: dict[str, Any]) -> int:
    """The response's `usage.prompt_tokens_details.cached_tokens` (0 when absent)."""
    details = body["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)
