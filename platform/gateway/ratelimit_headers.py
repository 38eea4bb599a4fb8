"""x-ratelimit-* headers in OpenAI's format, for both admitted and denied requests."""

from __future__ import annotations

from tenancy.errors import RateInfo


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: "250ms", "1.5s", "6m0s"."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60.0:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def rate_limit_headers(requests: RateInfo | None, tokens: RateInfo | None) -> dict[str, str]:
    """The -requests and -tokens triples for the limits that exist (none when unlimited)."""
    headers: dict[str, str] = {}
    for suffix, info in (("requests", requests), ("tokens", tokens)):
        if info is None:
            continue
        headers[f"x-ratelimit-limit-{suffix}"] = str(info.limit)
        headers[f"x-ratelimit-remaining-{suffix}"] = str(info.remaining)
        headers[f"x-ratelimit-reset-{suffix}"] = format_duration(info.reset_s)
    return headers
